"""Fused elementwise programs as one generated CUDA kernel (a CuPy `ElementwiseKernel`).

Each program becomes one kernel: every instruction is one C++ statement on per-element
registers, so a chain of any length reads its inputs once and writes its output once, and the
source grows linearly with the program (a statement reads earlier results by register name,
however often its formula names them). Generating or compiling a kernel that fails raises
`CodegenError`, which is never taken for the data running out of memory. `kernels/cuda_source`
builds the whole text CuPy compiles for a kernel, and NVRTC compiles it in CI, with no GPU.
`kernel_source` is a pure function (program, input dtypes) -> kernel source and is tested on
machines without a GPU; `evaluate` compiles (once per program and input dtypes, cached) and
launches. CuPy is imported only inside `evaluate`.

Typing follows NumPy, as on the CPU (`elementwise` holds the reference semantics):

- every temporary is declared with the C type of its instruction's dtype, so each
  instruction's result is rounded (or wrapped) to that dtype exactly where NumPy rounds;
- operands are converted to the dtype NumPy's loop computes in: the result dtype, or the
  promoted operand dtype for comparisons; float16 values are computed in float (CuPy's
  `float16` is a storage type) and rounded once per instruction;
- constants are inlined as literals of their dtype (non-finite ones by bit pattern);
- sigmoid and gelu use the same formula and evaluation order as the CPU engines; maximum and
  minimum propagate NaN; relu keeps NaN; div is true division; integer pow is exponentiation
  by squaring (NumPy raises for negative exponents; here they give 1 / b**|e| truncated
  towards zero: 1 for b == 1, +-1 for b == -1, else 0);
- float-to-integer casts of NaN or out-of-range values are undefined, as in NumPy.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Any, Sequence

import numpy as np

from deepx_flow.errors import CodegenError, ExecutionError
from deepx_flow.ir.program import WHOLE_AXIS_OPS, Program, whole_axes
from deepx_flow.kernels import softmax
from deepx_flow.kernels.elementwise import (COMPARISONS, GELU_C, GELU_K, OPS, apply_op,
                                            compute_dtype, constant)
from deepx_flow.kernels.fused_cpu import check_call
from deepx_flow.kernels.fused_cpu import evaluate as evaluate_cpu

# NumPy dtype name -> the C type CuPy uses for it in kernel code.
CTYPES: dict[str, str] = {
    "bool": "bool", "int8": "signed char", "int16": "short", "int32": "int",
    "int64": "long long", "uint8": "unsigned char", "uint16": "unsigned short",
    "uint32": "unsigned int", "uint64": "unsigned long long", "float16": "float16",
    "float32": "float", "float64": "double",
}

# Helpers the generated bodies call; passed to ElementwiseKernel as its preamble.
PREAMBLE = r"""
template <typename T>
__device__ T dx_ipow(T b, T e) {
    // NumPy semantics for e >= 0; for e < 0, 1 / b**|e| truncated towards zero.
    if (e < 0) {
        if (b == 1) return 1;
        if (b == -1) return (e & 1) ? -1 : 1;
        return 0;
    }
    T r = 1;
    while (e) {
        if (e & 1) r *= b;
        e >>= 1;
        b *= b;
    }
    return r;
}
"""

# CuPy includes its float16 type only when an argument is float16, but a program on other
# dtypes may hold float16 values (a cast, a float16 constant): the kernel includes it always
# (the header guards itself). What CuPy gets as the preamble: this, then the helpers.
FLOAT16_HEADER = '#include "cupy/float16.cuh"\n'
KERNEL_PREAMBLE = FLOAT16_HEADER + PREAMBLE

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_MATH = ("exp", "log", "sqrt", "tanh", "erf", "sin", "cos", "tan", "sinh", "cosh", "asinh",
         "acosh", "atanh")


def kernel_name(program: Program, in_dtypes: Sequence[str]) -> str:
    """A stable kernel name derived from the program and input dtypes."""
    digest = hashlib.sha1(repr((program, tuple(in_dtypes))).encode()).hexdigest()[:12]
    return f"dx_fused_{digest}"


def kernel_source(program: Program, in_dtypes: Sequence[str]) -> tuple[str, str, str]:
    """The `ElementwiseKernel` source of a fused program: one kernel for the whole chain.

    Parameters
    ----------
    program
        A fused program (see `deepx_flow.ir.program`).
    in_dtypes
        The dtype names of the task's input arrays; the kernel takes those the program reads.

    Returns
    -------
    (in_params, out_params, body)
        Strings for `cupy.ElementwiseKernel`: e.g. `"float32 in0, float32 in1"`,
        `"float32 out0"`, and the C++ statements of the body. The body calls helpers of
        `PREAMBLE`.

    Raises
    ------
    ExecutionError
        For an empty program, an unknown operator or dtype, or a bad argument reference.
    """
    if not program:
        raise ExecutionError("cannot generate a kernel for an empty fused program")
    in_dtypes = tuple(in_dtypes)
    used = sorted({a[1] for _, args, _ in program for a in args if a[0] == "in"})
    for k in used:
        if k >= len(in_dtypes) or in_dtypes[k] not in CTYPES:
            raise ExecutionError(f"fused program reads input {k}, but the input dtypes are "
                                 f"{list(in_dtypes)}")
    in_params = ", ".join(f"{in_dtypes[k]} in{k}" for k in used)
    out_dtype = _check_dtype(program[-1][2])
    out_params = f"{out_dtype} out0"
    lines = []
    for j, (op, args, dtype) in enumerate(program):
        _check_dtype(dtype)
        operands = [_ref(a, j, in_dtypes, program) for a in args]
        expr = _instruction(op, operands, dtype)
        lines.append(f"const {CTYPES[dtype]} t{j} = {expr};")
    lines.append(f"out0 = t{len(program) - 1};")
    return in_params, out_params, "\n".join(lines)


def _check_dtype(dtype: str) -> str:
    if dtype not in CTYPES:
        raise ExecutionError(f"dtype {dtype!r} has no CUDA kernel type; use one of "
                             f"{', '.join(CTYPES)}")
    return dtype


def _ref(arg, j: int, in_dtypes, program) -> tuple[str, str]:
    if arg[0] == "in":
        return f"in{arg[1]}", in_dtypes[arg[1]]
    if arg[0] == "t":
        if not 0 <= arg[1] < j:
            raise ExecutionError(f"fused program instruction {j} reads temporary {arg[1]}, "
                                 "which is not computed before it")
        return f"t{arg[1]}", program[arg[1]][2]
    if arg[0] == "c":
        return literal(arg[1], _check_dtype(arg[2])), arg[2]
    raise ExecutionError(f"bad fused-program argument {arg!r}; expected ('in', k), ('t', j) "
                         "or ('c', value, dtype)")


def literal(value: Any, dtype: str) -> str:
    """A C++ expression of type `dtype` (its compute type, for float16) holding `value`.

    The value is first rounded to `dtype` as NumPy would, so the kernel sees exactly the
    constant the CPU engines see. float16 constants are emitted as float, the type float16
    values are computed in.
    """
    with np.errstate(all="ignore"):
        v = np.asarray(value, dtype=dtype)[()]
    if dtype == "bool":
        return "true" if v else "false"
    kind = np.dtype(dtype).kind
    if kind in "iu":
        iv = int(v)
        if dtype == "int64" and iv == -2**63:
            return "(-9223372036854775807LL - 1LL)"
        suffix = "ULL" if kind == "u" else "LL"
        return f"(({CTYPES[dtype]}){iv}{suffix})"
    ct = CTYPES[compute_dtype(dtype)]
    fv = float(v)
    if math.isfinite(fv):
        return f"(({ct}){fv!r})"
    if ct == "float":
        bits = struct.unpack("<i", struct.pack("<f", fv))[0]
        return f"__int_as_float({bits})"
    bits = struct.unpack("<q", struct.pack("<d", fv))[0]
    return f"__longlong_as_double({bits}LL)"


def _conv(operand: tuple[str, str], dst: str) -> str:
    """C++ for `operand` converted to `dst` as NumPy's astype would (float16 via float).

    A `dst` of float16 gives a float16 value; use the compute type to get a float.
    """
    code, src = operand
    if src == dst:
        return code
    if src == "float16":
        code, src = f"((float)({code}))", "float32"
        if dst == "float32":
            return code
    if dst == "bool":
        return f"(({code}) != 0)"
    if dst == "float16":
        return f"float16((float)({code}))"
    return f"(({CTYPES[dst]})({code}))"


def _instruction(op: str, operands: list[tuple[str, str]], r: str) -> str:
    if op not in OPS:
        raise ExecutionError(f"unknown elementwise operator {op!r} in a fused program")
    if op == "cast":
        return _conv(operands[0], r)
    if op in COMPARISONS:
        c = compute_dtype(np.result_type(operands[0][1], operands[1][1]).name)
        a, b = (_conv(o, c) for o in operands)
        return f"({a} {_CMP[op]} {b})"
    cc = compute_dtype(r)
    if op == "where":
        cond = _conv(operands[0], "bool")
        a, b = (_conv(o, cc) for o in operands[1:])
        expr = f"({cond} ? {a} : {b})"
    else:
        xs = [_conv(o, cc) for o in operands]
        expr = _compute(op, xs, cc)
    return f"float16({expr})" if r == "float16" else expr


def _compute(op: str, xs: list[str], c: str) -> str:
    """C++ for op on operands already in the compute dtype `c` (never float16)."""
    a = xs[0]
    b = xs[1] if len(xs) > 1 else None
    kind = np.dtype(c).kind
    if c == "bool":
        # NumPy's bool loops: add is or, mul is and, maximum is or, minimum is and.
        table = {"abs": a, "floor": a, "ceil": a, "round": a,
                 "add": f"({a} || {b})", "mul": f"({a} && {b})",
                 "maximum": f"({a} || {b})", "minimum": f"({a} && {b})"}
        if op not in table:
            raise ExecutionError(f"{op} is not defined for bool operands")
        return table[op]
    one, zero = literal(1, c), literal(0, c)
    if op == "neg":
        return f"(-{a})"
    if op == "abs":
        if kind == "f":
            return f"fabs({a})"  # fabs(-0.0) is 0.0, like NumPy's absolute
        return a if kind == "u" else f"({a} < 0 ? -{a} : {a})"
    if op in _MATH:
        return f"{op}({a})"
    if op in ("floor", "ceil", "round"):  # integers are whole already; round is rint
        return a if kind != "f" else f"{'rint' if op == 'round' else op}({a})"
    if op == "sign":  # NaN stays NaN; -0.0 gives +0.0, as NumPy's sign
        return (f"(({a}) > {zero} ? {one} : (({a}) < {zero} ? {literal(-1, c)} : "
                f"(({a}) != ({a}) ? ({a}) : {zero})))"
                if kind != "u" else f"(({a}) > {zero} ? {one} : {zero})")
    if op == "reciprocal":
        return f"({one} / {a})"
    if op == "softplus":  # logaddexp(0, x), as NumPy computes it
        return f"((({a}) > {zero} ? ({a}) : {zero}) + log1p(exp(-fabs({a}))))"
    if op == "sigmoid":
        return f"({one} / ({one} + exp(-{a})))"
    if op == "gelu":
        inner = f"(({a} + {literal(GELU_C, c)} * ({a} * {a} * {a})) * {literal(GELU_K, c)})"
        return f"(((tanh({inner}) + {one}) * {a}) * {literal(0.5, c)})"
    if op == "relu":
        return a if kind == "u" else f"({a} < {zero} ? {zero} : {a})"  # NaN stays NaN
    if op in _ARITH:
        return f"({a} {_ARITH[op]} {b})"
    if op == "pow":
        return f"pow({a}, {b})" if kind == "f" else f"dx_ipow<{CTYPES[c]}>({a}, {b})"
    if op in ("maximum", "minimum"):
        cmp = ">=" if op == "maximum" else "<="
        if kind == "f":
            # a wins when it compares so or is NaN; otherwise b (which carries b's NaN).
            return f"((({a}) {cmp} ({b}) || ({a}) != ({a})) ? ({a}) : ({b}))"
        return f"((({a}) {cmp} ({b})) ? ({a}) : ({b}))"
    raise ExecutionError(f"no CUDA lowering for {op!r}")


_KERNELS: dict[str, Any] = {}
_KERNELS_MAX = 1024


def _kernel(program: Program, in_dtypes: tuple[str, ...]):
    """The compiled kernel of a program, cached by the program's repr (which tells 0.0 from
    -0.0 and matches NaN constants, unlike tuple equality); CuPy caches the binaries."""
    key = repr((program, in_dtypes))
    kernel = _KERNELS.get(key)
    if kernel is None:
        import cupy
        try:
            in_params, out_params, body = kernel_source(program, in_dtypes)
        except (MemoryError, RecursionError) as err:
            raise codegen_error(program, "generating", err) from err
        kernel = cupy.ElementwiseKernel(in_params, out_params, body,
                                        name=kernel_name(program, in_dtypes),
                                        preamble=KERNEL_PREAMBLE)
        if len(_KERNELS) >= _KERNELS_MAX:
            _KERNELS.clear()
        _KERNELS[key] = kernel
    return kernel


def _compile_errors() -> tuple[type, ...]:
    """The exceptions CuPy raises when NVRTC cannot compile a kernel."""
    from cupy.cuda.compiler import CompileException
    try:
        from cupy_backends.cuda.libs.nvrtc import NVRTCError
    except ImportError:  # older CuPy
        return (CompileException,)
    return (CompileException, NVRTCError)


def codegen_error(program: Program, step: str, err: BaseException) -> CodegenError:
    """The error for `step` ("generating", "compiling") the CUDA kernel of `program` failing."""
    return CodegenError(
        f"{step} the CUDA kernel of a fused program of {len(program)} instructions failed "
        f"({type(err).__name__}: {str(err)[:200] or 'no message'}). This is a limit of "
        "deepx_flow's code generator or of NVRTC, not a lack of memory for the data: smaller "
        "chunks would not help; please report it with the graph")


def _evaluate_stepwise(program: Program, arrays: list, out_shape: tuple[int, ...], xp) -> Any:
    """A program with whole-axis instructions, one array operation per instruction at the
    output shape (an ElementwiseKernel sees one element at a time, a softmax a whole axis).
    softmax and log_softmax of one value along one axis share their normalizer."""
    last_use = {a[1]: j for j, (_, args, _) in enumerate(program) for a in args if a[0] == "t"}
    values: list[Any] = []
    shared: dict = {}
    for j, (op, args, dtype) in enumerate(program):
        operands = [xp.broadcast_to(arrays[a[1]], out_shape) if a[0] == "in" else
                    values[a[1]] if a[0] == "t" else constant(a[1], a[2], xp) for a in args]
        if op in WHOLE_AXIS_OPS:
            group = (args[0], args[1][1])
            if group not in shared:
                x = xp.broadcast_to(operands[0], out_shape).astype(dtype, copy=False)
                shared[group] = softmax.normalize(x, group[1], xp)
            values.append(softmax.finish(op, shared[group], xp))
        else:
            values.append(apply_op(op, operands, dtype, xp))
        for a in args:  # free what no later instruction reads
            if a[0] == "t" and last_use[a[1]] == j:
                values[a[1]] = None
                shared = {g: v for g, v in shared.items() if g[0] != a}
    result = values[-1]
    if result.shape != out_shape:
        result = xp.broadcast_to(result, out_shape)
    return xp.ascontiguousarray(result) if result.ndim else result.copy()


def evaluate(program: Program, arrays: Sequence[Any], out_shape: tuple[int, ...]) -> Any:
    """Evaluate a fused elementwise program on CuPy arrays with one generated kernel.

    Parameters
    ----------
    program
        A fused program (see `deepx_flow.ir.program`).
    arrays
        The task's input arrays (CuPy; NumPy arrays are copied to the device).
    out_shape
        The task's output shape; the inputs must broadcast to it.

    Returns
    -------
    cupy.ndarray
        A new array of shape `out_shape` and the dtype of the program's last instruction.

    Raises
    ------
    ExecutionError
        For an empty program, missing inputs or inputs that do not broadcast to `out_shape`;
        its subclass CodegenError when generating or compiling the kernel fails.
    """
    import cupy
    arrays = [cupy.asarray(a) for a in arrays]
    used, shape = check_call(program, [a.shape for a in arrays], out_shape)
    out_shape = tuple(int(s) for s in out_shape)
    dtype = program[-1][2]
    if whole_axes(program):
        if math.prod(out_shape) == 0:
            return cupy.empty(out_shape, dtype=dtype)
        return _evaluate_stepwise(program, arrays, out_shape, cupy)
    if not used:
        # No array input: evaluate once on 0-d operands; an ElementwiseKernel needs an input.
        value = evaluate_cpu(program, [], ())
        return cupy.full(out_shape, value[()], dtype=dtype)
    in_dtypes = tuple(a.dtype.name for a in arrays)
    kernel = _kernel(program, in_dtypes)
    result = cupy.empty(shape, dtype=dtype)
    if result.size:
        # CuPy compiles the kernel (NVRTC) at its first launch: a failure to compile is the
        # code generator's, not the data's (an NVRTC out-of-memory error included).
        try:
            kernel(*[arrays[k] for k in used], result)
        except _compile_errors() as err:
            raise codegen_error(program, "compiling", err) from err
    if shape == out_shape:
        return result
    out = cupy.empty(out_shape, dtype=dtype)
    out[...] = result
    return out
