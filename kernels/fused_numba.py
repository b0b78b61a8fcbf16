"""Fused programs of exact operations compiled to one loop with numba, for batch chains.

A conv net's chain (`kernels/batch_chain.py`) evaluates the same small programs (a bias and
an activation: add, then relu or hard-swish's add mul add maximum minimum mul) on every block
of images; through NumPy each instruction is a pass over the block, and these passes were
most of a MobileNet chain's time. Here such a program becomes one NumPy ufunc whose loop
numba compiles: one pass, NumPy's broadcasting and layouts.

Only programs whose every instruction is exact in IEEE arithmetic (one rounding of the exact
result, whatever the order of evaluation: `EXACT_OPS`), on one float dtype throughout, are
compiled; their results are NumPy's to the bit (`elementwise.apply_op`), signs of zeros
included; NaN stays NaN (its sign and payload bits are not NumPy's promise either: its SIMD
loop and its scalar tail differ). maximum and minimum propagate NaN, and pick between equal
operands (0.0 and -0.0) as this machine's NumPy does, probed once (`zero_ties`); where NumPy
follows neither rule a program using them is left to `fused_cpu`. Every other program goes
to `fused_cpu` as before.

Two forms of the same scalar program: where every operand is, along the result's trailing
axes, either all of them or none (a chain's activations, a per-channel bias, a per-image
gate of squeeze-and-excitation), a loop of our own runs over contiguous rows, which the
compiler vectorizes (5 times NumPy's ufunc machinery around a numba ufunc, whose inner loop
takes any strides and is not vectorized); any other broadcasting goes through the ufunc.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.ir.program import Program
from deepx_flow.kernels import compiled, zero_ties

EXACT_OPS = frozenset({"add", "sub", "mul", "neg", "abs", "maximum", "minimum", "relu"})
DTYPES = ("float32", "float64")
_CACHE_MAX = 256
_compiled: dict = {}


def compilable(program: Program, in_dtypes) -> bool:
    """Whether `program` on inputs of `in_dtypes` is one this module compiles (in a process
    that runs compiled kernels: `compiled.allowed`)."""
    if not program or not compiled.allowed():
        return False
    dtype = program[-1][2]
    if dtype not in DTYPES or any(d != dtype for d in in_dtypes):
        return False
    for op, args, out_dtype in program:
        if op not in EXACT_OPS or out_dtype != dtype:
            return False
        if op in ("maximum", "minimum", "relu") and zero_ties.rule(op, dtype) is None:
            return False
        if any(a[0] == "c" and (a[2] != dtype or not finite(a[1], dtype)) for a in args):
            return False
    return True


def finite(value, dtype: str) -> bool:
    """Whether a constant is finite once rounded to `dtype` (1e39 is inf in float32)."""
    try:
        with np.errstate(all="ignore"):
            return bool(np.isfinite(np.asarray(value, dtype)))
    except (TypeError, OverflowError, ValueError):
        return False


def evaluate(program: Program, arrays, out: np.ndarray) -> np.ndarray:
    """`program` on `arrays` (broadcasting as in NumPy) into `out`, in one pass."""
    return prepare(program, arrays, out)(arrays, out)


def prepare(program: Program, arrays, out: np.ndarray):
    """`evaluate` for operands and results of these shapes, dtypes and layouts (a chain's
    every block but its last), its form and compiled kernel chosen once: a function of
    (arrays, out)."""
    rows = _as_rows(arrays, out)
    if rows is None:
        return lambda arrays, out: _through_ufunc(program, arrays, out)
    views, patterns, result = rows
    shapes, result_shape = [v.shape for v in views], result.shape
    given = [a.shape for a in arrays], out.shape  # what the views were made for
    kernels = {}  # by the operand written over (looked up by program: 14 us of repr)

    def by_rows(arrays, out):
        over = None
        fits = out.flags.c_contiguous and ([a.shape for a in arrays], out.shape) == given
        for i, a in enumerate(arrays):
            if a is out:
                over = i
            elif not a.flags.c_contiguous or np.may_share_memory(a, out):
                fits = False  # laid out otherwise this time, or overlapping the result
        if not fits:  # NumPy's ufuncs mind overlaps and take any shapes
            return _through_ufunc(program, arrays, out)
        kernel = kernels.get(over)
        if kernel is None:
            kernel = kernels[over] = _row_kernel(program, patterns, over)
        kernel(*[a.reshape(s) for a, s in zip(arrays, shapes)], out.reshape(result_shape))
        return out
    return by_rows


def _through_ufunc(program: Program, arrays, out: np.ndarray) -> np.ndarray:
    ufunc = _ufunc(program, len(arrays))
    with np.errstate(all="ignore"):  # inf and NaN silently, as `elementwise` gives them
        return ufunc(*arrays, out=out)


def _as_rows(arrays, out: np.ndarray):
    """The operands and the result seen as (A, B, P) arrays, each operand spanning the
    result's A, B and P or 1 along each, P the result's trailing axes, all contiguous:
    (operand views, which of A, B and P each spans, the result's view); None where they do
    not fit that form (an operand varying along some trailing axes only, a strided one)."""
    if not out.flags.c_contiguous or not all(a.flags.c_contiguous for a in arrays):
        return None
    keep = [i for i, n in enumerate(out.shape) if n != 1]  # axes of 1 say nothing
    shape = tuple(out.shape[i] for i in keep)
    spans = []
    for a in arrays:
        dims = (1,) * (out.ndim - a.ndim) + a.shape
        spans.append(tuple(dims[i] != 1 for i in keep))
    # the trailing axes from `lead` on: each operand spans all of them or none
    lead = next(k for k in range(len(shape) + 1)
                if all(len(set(span[k:])) <= 1 for span in spans))
    if lead > 2:
        return None
    pad = 2 - lead
    shape3 = (1,) * pad + shape[:lead] + (math.prod(shape[lead:]),)
    patterns, views = [], []
    for a, span in zip(arrays, spans):
        full = (False,) * pad + span[:lead] + (bool(span[lead:]) and span[-1],)
        patterns.append(full)
        views.append(a.reshape(tuple(n if f else 1 for n, f in zip(shape3, full))))
    return views, tuple(patterns), out.reshape(shape3)


def _ufunc(program: Program, n_inputs: int):
    # repr: 0.0 and -0.0 are equal keys of a dict, but not the same program
    key = (repr(program), n_inputs)
    found = _compiled.get(key)
    if found is None:
        if len(_compiled) >= _CACHE_MAX:
            _compiled.clear()
        found = _compiled[key] = _compile(program, n_inputs)
    return found


def _compile(program: Program, n_inputs: int):
    """The program as a scalar function of its inputs, vectorized by numba into a ufunc."""
    import numba
    dtype = program[-1][2]
    scalar = getattr(np, dtype)
    namespace = {"ZERO": scalar(0)}  # the constants, typed: a float32 program stays float32
    lines = [f"def f({', '.join(f'in{i}' for i in range(n_inputs))}):"]
    for j, (op, args, _) in enumerate(program):
        operands = []
        for a in args:
            if a[0] == "in":
                operands.append(f"in{a[1]}")
            elif a[0] == "t":
                operands.append(f"t{a[1]}")
            else:
                name = f"k{len(namespace)}"
                namespace[name] = scalar(a[1])
                operands.append(name)
        lines.append(f"    t{j} = {expression(op, operands, zero_ties.rule(op, dtype))}")
    lines.append(f"    return t{len(program) - 1}")
    exec("\n".join(lines), namespace)  # noqa: S102 (source made here from the program)
    signature = f"{dtype}({', '.join([dtype] * n_inputs)})"
    return numba.vectorize([signature], nopython=True)(namespace["f"])


def _row_kernel(program: Program, patterns: tuple, over: int | None):
    """The program as a loop over (A, B, P) arrays (`_as_rows`), compiled: per row of the
    result, the operands constant along it are read once and the others along with it.
    `over`: the operand the result is written over, if any, read through the result's row
    (the compiler then sees one array read and written at the same index, and vectorizes
    the loop; as two arrays that might overlap anyhow, it would not)."""
    key = (repr(program), patterns, over)
    found = _compiled.get(key)
    if found is None:
        if len(_compiled) >= _CACHE_MAX:
            _compiled.clear()
        found = _compiled[key] = _compile_rows(program, patterns, over)
    return found


def _compile_rows(program: Program, patterns: tuple, over: int | None):
    """The source of `_row_kernel`'s loop, written from the program and compiled (in each
    process: numba caches no function made by exec on disk)."""
    import numba
    dtype = program[-1][2]
    scalar = getattr(np, dtype)
    namespace = {"ZERO": scalar(0)}
    n = len(patterns)
    lines = [f"def kernel({', '.join(f'in{i}' for i in range(n))}, out):",
             "    for a in range(out.shape[0]):",
             "        for b in range(out.shape[1]):",
             "            row = out[a, b]"]
    names = []
    for i, (span_a, span_b, span_p) in enumerate(patterns):
        at = f"{'a' if span_a else 0}, {'b' if span_b else 0}"
        if i == over:
            names.append("row[p]")
        elif span_p:
            lines.append(f"            r{i} = in{i}[{at}]")
            names.append(f"r{i}[p]")
        else:
            lines.append(f"            s{i} = in{i}[{at}, 0]")
            names.append(f"s{i}")
    lines.append("            for p in range(row.shape[0]):")
    for j, (op, args, _) in enumerate(program):
        operands = []
        for arg in args:
            if arg[0] == "in":
                operands.append(names[arg[1]])
            elif arg[0] == "t":
                operands.append(f"t{arg[1]}")
            else:
                name = f"k{len(namespace)}"
                namespace[name] = scalar(arg[1])
                operands.append(name)
        lines.append(f"                t{j} = {expression(op, operands, zero_ties.rule(op, dtype))}")
    lines.append(f"                row[p] = t{len(program) - 1}")
    exec("\n".join(lines), namespace)  # noqa: S102 (source made here from the program)
    return numba.njit(nogil=True, boundscheck=False)(namespace["kernel"])


def expression(op: str, x: list[str], tie: str | None) -> str:
    """The scalar form of one instruction, as NumPy computes it; `tie` says which operand
    maximum and minimum give when their operands are equal (0.0 and -0.0)."""
    if op == "add":
        return f"{x[0]} + {x[1]}"
    if op == "sub":
        return f"{x[0]} - {x[1]}"
    if op == "mul":
        return f"{x[0]} * {x[1]}"
    if op == "neg":
        return f"-{x[0]}"
    if op == "abs":
        return f"abs({x[0]})"
    if op == "relu":  # maximum(x, 0)
        op, x = "maximum", [x[0], "ZERO"]
    # the first operand where it wins (or ties, if NumPy gives the first) or is NaN, else the
    # second (so NaN from either side propagates)
    wins = {"maximum": ">", "minimum": "<"}[op] + ("=" if tie == "first" else "")
    return f"{x[0]} if ({x[0]} {wins} {x[1]} or {x[0]} != {x[0]}) else {x[1]}"
