"""Reference semantics of the elementwise operators, for NumPy and CuPy alike.

`apply_op` is the meaning of every elementwise operator of `deepx_flow.ops.elementwise`:
the fused evaluators (`fused_cpu`, `fused_gpu`) must agree with it, and the blocked CPU
evaluator calls it directly on cache-sized blocks. It is written against the array module
`xp` (numpy or cupy), so the same code states the semantics on both devices.

The rules:

- Result dtypes are the instruction's dtype, which the IR took from NumPy's ufunc rules.
  Plain ufunc operators run NumPy's (or CuPy's) own loop for their operands; constants come in
  as typed 0-d arrays (`constant`), which NumPy 2 treats as strongly typed, so `x_f32 * c_f32`
  stays float32.
- Composite operators (sigmoid, gelu) are computed in the result dtype, except float16, which is
  computed in float32 and rounded once at the end (this is also what the CUDA kernels do, and
  it is within float16's own rounding of a step-by-step float16 evaluation). Their evaluation
  order is fixed, so every engine rounds the same way:

      sigmoid(x) = 1 / (1 + exp(-x))
      gelu(x)    = ((tanh((x + GELU_C * (x * x * x)) * GELU_K) + 1) * x) * 0.5

- erf is SciPy's `special.erf` (CuPy's `cupyx.scipy.special.erf`, CUDA's `erf` in generated
  kernels), in the result dtype (float32 for float16, rounded once).
- relu(x) = maximum(x, 0): NaN stays NaN; maximum and minimum propagate NaN like NumPy's.
- sin, cos, tan, sinh, cosh, asinh (arcsinh), acosh, atanh, floor, ceil and sign are NumPy's
  ufuncs (floor and ceil keep integers as they are). round is `rint` (halves to even) on
  floats and leaves integers as they are.
  reciprocal is 1 / x and softplus is `logaddexp(0, x)` (log(1 + e**x) without overflow),
  both computed like the composite operators: in the result dtype, float16 in float32.
- div is true division (integers give floats); pow follows NumPy, including its ValueError for
  integers raised to negative integer powers on the CPU.
- bfloat16 (NumPy only: CuPy has none) computes in float32: operands are widened (exactly),
  the operator runs as it would in float32 (or in the wider dtype its result has, a float64 sum
  of bfloat16 and float64), and a bfloat16 result is rounded once (`kernels.bfloat16`). This
  is what NumPy with ml_dtypes gives op by op; `where` selects bits and `cast` rounds once
  from any dtype, float64 included.
- Floating-point exceptions (overflow, 0/0, log of a negative) give inf or NaN silently: a
  kernel inside a Dask worker has nobody to show a warning to.
"""

from __future__ import annotations

import contextlib
import math
from types import ModuleType
from typing import Any

import numpy as np

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels import bfloat16

# op name -> ufunc name; the same names exist in NumPy and CuPy.
UFUNCS: dict[str, str] = {
    "neg": "negative", "abs": "absolute", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "tanh": "tanh", "add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide",
    "pow": "power", "maximum": "maximum", "minimum": "minimum", "lt": "less",
    "le": "less_equal", "gt": "greater", "ge": "greater_equal", "eq": "equal",
    "ne": "not_equal", "sin": "sin", "cos": "cos", "tan": "tan", "floor": "floor",
    "ceil": "ceil", "sign": "sign", "sinh": "sinh", "cosh": "cosh", "asinh": "arcsinh",
    "acosh": "arccosh", "atanh": "arctanh",
}
COMPOSITE = ("sigmoid", "gelu", "relu", "round", "reciprocal", "softplus")
# Operators whose ufunc is SciPy's (CuPy's cupyx.scipy.special): NumPy has no erf.
SPECIAL = ("erf",)
OPS: frozenset[str] = frozenset(UFUNCS) | frozenset(COMPOSITE) | frozenset(SPECIAL) | \
    {"where", "cast"}
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")

GELU_C = 0.044715
GELU_K = math.sqrt(2.0 / math.pi)


def compute_dtype(dtype: str) -> str:
    """The dtype composite operators compute in to give a result of `dtype`.

    float16 and bfloat16 are computed in float32 and rounded once; every other dtype computes
    in itself.
    """
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def constant(value: Any, dtype: str, xp: ModuleType = np) -> Any:
    """A typed 0-d array holding `value` as `dtype`, on the module `xp`.

    A 0-d array (unlike a Python scalar) keeps its dtype in NumPy 2's promotion rules, so it
    combines with arrays exactly as the IR's typed constant does.

    Parameters
    ----------
    value
        A bool, int or float (NaN and infinities included).
    dtype
        A NumPy dtype name, e.g. "float32".
    xp
        The array module, numpy or cupy.
    """
    if dtype == "bfloat16":  # rounded once from the value (ml_dtypes rounds via float32)
        return bfloat16.to_bfloat16(np.asarray(value, dtype=np.float64))
    return xp.asarray(value, dtype=dtype)


def _quiet(xp: ModuleType):
    # CuPy has no floating-point error state to silence.
    return np.errstate(all="ignore") if xp is np else contextlib.nullcontext()


def _unknown(op: str) -> ExecutionError:
    return ExecutionError(f"unknown elementwise operator {op!r} in a fused program; "
                          f"known: {', '.join(sorted(OPS))}")


def apply_op(op: str, args: list, dtype: str, xp: ModuleType = np, out: Any = None) -> Any:
    """Apply one elementwise operator with the reference semantics of deepx_flow.

    Parameters
    ----------
    op
        An elementwise operator name (`OPS`), e.g. "add", "gelu", "where", "cast".
    args
        Its operands: arrays of `xp` (typed 0-d arrays for constants, see `constant`), which
        broadcast against each other as in NumPy.
    dtype
        The result dtype (the instruction's dtype, NumPy's result type for the operator).
    xp
        The array module, numpy or cupy.
    out
        Optional array of dtype `dtype` and the broadcast shape to write into (the blocked
        evaluator passes its block buffers). It must not share memory with any operand.

    Returns
    -------
    array
        `out` when given, else a new array of dtype `dtype`.

    Raises
    ------
    ExecutionError
        For an unknown operator, or bfloat16 on a GPU.
    """
    if dtype == "bfloat16" or any(bfloat16.is_bfloat16(a) for a in args):
        return _bfloat16_op(op, args, dtype, xp, out)
    with _quiet(xp):
        if op in UFUNCS:
            ufunc = getattr(xp, UFUNCS[op])
            if out is None:
                return xp.asarray(ufunc(*args), dtype=dtype)
            ufunc(*args, out=out, casting="unsafe")
            return out
        if op in SPECIAL:
            return _special(op, args[0], dtype, xp, out)
        if op == "relu":
            zero = constant(0, dtype, xp)
            if out is None:
                return xp.asarray(xp.maximum(args[0], zero), dtype=dtype)
            xp.maximum(args[0], zero, out=out, casting="unsafe")
            return out
        if op == "round":
            if np.dtype(dtype).kind != "f":  # integers and bools are whole already
                return apply_op("cast", args, dtype, xp, out)
            if out is None:
                return xp.asarray(xp.rint(args[0]), dtype=dtype)
            xp.rint(args[0], out=out, casting="unsafe")
            return out
        if op == "reciprocal":
            return _composite(_reciprocal_steps, args[0], dtype, xp, out)
        if op == "softplus":
            return _composite(_softplus_steps, args[0], dtype, xp, out)
        if op == "sigmoid":
            return _composite(_sigmoid_steps, args[0], dtype, xp, out)
        if op == "gelu":
            return _composite(_gelu_steps, args[0], dtype, xp, out)
        if op == "where":
            cond, a, b = args
            if xp is np and np.dtype(dtype).itemsize in _UINT:
                return _select(cond, a, b, dtype, out)
            if out is None:
                return xp.asarray(xp.where(cond, a, b), dtype=dtype)
            # where() into a block-sized temporary, then one copy, measured 1.5x faster than two
            # copyto calls (the second masked) on 32K-element blocks.
            xp.copyto(out, xp.where(cond, a, b), casting="unsafe")
            return out
        if op == "cast":
            if out is None:
                return xp.asarray(args[0]).astype(dtype)  # astype copies: a fresh array
            xp.copyto(out, args[0], casting="unsafe")
            return out
    raise _unknown(op)


def _bfloat16_op(op: str, args: list, dtype: str, xp: ModuleType, out: Any) -> Any:
    """An operator with a bfloat16 operand or result: computed in float32 (or the wider
    result dtype) on widened operands, a bfloat16 result rounded once."""
    if xp is not np:
        raise ExecutionError(f"{op}: bfloat16 runs on CPU workers only (CuPy has no "
                             "bfloat16); cast to float32 or float16 for GPUs")
    if op == "cast":
        result = bfloat16.astype(np.asarray(args[0]), dtype)
    elif op == "where" and dtype == "bfloat16":
        # The operands are bool, int8, uint8 or bfloat16 (the promotion rule): the result
        # is their exact bits.
        return _select(args[0], bfloat16.to_bfloat16(args[1]), bfloat16.to_bfloat16(args[2]),
                       dtype, out)
    else:
        result = apply_op(op, [bfloat16.widen(a) for a in args],
                          compute_dtype(dtype), xp)
    if out is None:
        return bfloat16.astype(result, dtype)
    return bfloat16.copyto(out, result)


# Unsigned integers of each item size, for selecting bits (`_select`).
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _select(cond, a, b, dtype: str, out):
    """NumPy's where(cond, a, b) in `dtype`, without a branch per element: each of a and b,
    cast to `dtype`, is ANDed with a mask of all ones where it is picked and zeros where not,
    and the two ORed; the result has the picked value's exact bits (NaN payloads, -0.0).
    np.where branches on every element, and a condition without a pattern (relu's gradient
    mask) mispredicts half of them: 2M float32 took 7.5 ms there, 1.5 ms here. One temporary
    (the mask), reused in place: fresh ones cost more than the work on a 1 MB block."""
    unsigned = _UINT[np.dtype(dtype).itemsize]
    a = np.asarray(a, dtype).view(unsigned)
    b = np.asarray(b, dtype).view(unsigned)
    cond = np.asarray(cond).astype(bool, copy=False).view(np.uint8)
    shape = np.broadcast_shapes(cond.shape, a.shape, b.shape)
    mask = np.empty(shape, unsigned)
    np.negative(cond, dtype=unsigned, out=mask)  # 1 -> all ones (wraps), 0 -> 0
    direct = out is not None and out.dtype == np.dtype(dtype) and out.shape == shape
    result = out.view(unsigned) if direct else np.empty(shape, unsigned)
    if direct and np.may_share_memory(result, b):  # b is read after result is written
        result = np.empty(shape, unsigned)
        direct = False
    np.bitwise_and(a, mask, out=result)
    np.invert(mask, out=mask)
    np.bitwise_and(b, mask, out=mask)
    np.bitwise_or(result, mask, out=result)
    if direct:
        return out
    if out is None:
        return result.view(dtype)
    np.copyto(out, result.view(dtype), casting="unsafe")
    return out


def _special(op: str, x, dtype: str, xp: ModuleType, out):
    """SciPy's ufunc (CuPy's on a GPU) in the result dtype; float16 computes in float32 and
    rounds once, as the composite operators do."""
    if xp is np:
        from scipy import special
    else:
        from cupyx.scipy import special
    ct = compute_dtype(dtype)
    result = getattr(special, op)(xp.asarray(x, dtype=ct))
    if out is None:
        return result if ct == dtype else result.astype(dtype)
    xp.copyto(out, result, casting="unsafe")
    return out


def _composite(steps, x, dtype: str, xp: ModuleType, out):
    """Run `steps(x, w, ct, xp)` in a work array `w` of the compute dtype, then round to dtype."""
    ct = compute_dtype(dtype)
    x = xp.asarray(x)
    if out is not None and out.dtype == ct:
        w = out
    else:
        w = xp.empty(out.shape if out is not None else x.shape, dtype=ct)
    steps(x, w, ct, xp)
    if out is None:
        return w if ct == dtype else w.astype(dtype)
    if w is not out:
        xp.copyto(out, w, casting="unsafe")
    return out


def _sigmoid_steps(x, w, ct: str, xp: ModuleType) -> None:
    # In place in w: 1 / (1 + exp(-x)); `dtype=ct` converts x before negating (ints, bools).
    one = constant(1, ct, xp)
    xp.negative(x, out=w, dtype=ct)
    xp.exp(w, out=w)
    xp.add(w, one, out=w)
    xp.true_divide(one, w, out=w)


def _reciprocal_steps(x, w, ct: str, xp: ModuleType) -> None:
    xp.copyto(w, x, casting="unsafe")
    xp.true_divide(constant(1, ct, xp), w, out=w)


def _softplus_steps(x, w, ct: str, xp: ModuleType) -> None:
    # logaddexp(0, x) = max(x, 0) + log1p(exp(-|x|)): neither overflows nor loses small values
    xp.copyto(w, x, casting="unsafe")
    xp.logaddexp(constant(0, ct, xp), w, out=w)


def _gelu_steps(x, w, ct: str, xp: ModuleType) -> None:
    # In place in w, in the documented order, so NumPy, numexpr and CUDA round alike.
    xp.multiply(x, x, out=w, dtype=ct)
    xp.multiply(w, x, out=w, dtype=ct)
    xp.multiply(w, constant(GELU_C, ct, xp), out=w)
    xp.add(w, x, out=w, dtype=ct)
    xp.multiply(w, constant(GELU_K, ct, xp), out=w)
    xp.tanh(w, out=w)
    xp.add(w, constant(1, ct, xp), out=w)
    xp.multiply(w, x, out=w, dtype=ct)
    xp.multiply(w, constant(0.5, ct, xp), out=w)
