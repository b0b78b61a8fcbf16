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
operands (0.0 and -0.0) as this machine's NumPy does, probed once (`_TIES`); where NumPy
follows neither rule a program using them is left to `fused_cpu`. Every other program goes
to `fused_cpu` as before.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.ir.program import Program

EXACT_OPS = frozenset({"add", "sub", "mul", "neg", "abs", "maximum", "minimum", "relu"})
DTYPES = ("float32", "float64")
_CACHE_MAX = 256
_compiled: dict = {}


def compilable(program: Program, in_dtypes) -> bool:
    """Whether `program` on inputs of `in_dtypes` is one this module compiles."""
    if not program:
        return False
    dtype = program[-1][2]
    if dtype not in DTYPES or any(d != dtype for d in in_dtypes):
        return False
    for op, args, out_dtype in program:
        if op not in EXACT_OPS or out_dtype != dtype:
            return False
        if op in ("maximum", "minimum", "relu") and _TIES.get((op, dtype)) is None:
            return False
        if any(a[0] == "c" and (a[2] != dtype or not _finite(a[1], dtype)) for a in args):
            return False
    return True


def _finite(value, dtype: str) -> bool:
    """Whether a constant is finite once rounded to `dtype` (1e39 is inf in float32)."""
    try:
        with np.errstate(all="ignore"):
            return bool(np.isfinite(np.asarray(value, dtype)))
    except (TypeError, OverflowError, ValueError):
        return False


def _probe_ties() -> dict:
    """(op, dtype) -> which operand NumPy's maximum / minimum gives between 0.0 and -0.0
    ("first" or "second", the same in both orders), None where it follows neither; relu is
    maximum(x, 0)."""
    ties = {}
    for dtype in DTYPES:
        zero, negative = np.zeros(64, dtype), np.full(64, -0.0, dtype)  # SIMD loops too
        for op in ("maximum", "minimum"):
            ufunc = getattr(np, op)
            a, b = np.signbit(ufunc(negative, zero)), np.signbit(ufunc(zero, negative))
            rule = "first" if a.all() and not b.any() else \
                "second" if b.all() and not a.any() else None
            ties[(op, dtype)] = rule
        ties[("relu", dtype)] = ties[("maximum", dtype)]
    return ties


_TIES = _probe_ties()


def evaluate(program: Program, arrays, out: np.ndarray) -> np.ndarray:
    """`program` on `arrays` (broadcasting as in NumPy) into `out`, in one pass."""
    ufunc = _ufunc(program, len(arrays))
    with np.errstate(all="ignore"):  # inf and NaN silently, as `elementwise` gives them
        return ufunc(*arrays, out=out)


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
        lines.append(f"    t{j} = {_expression(op, operands, _TIES.get((op, dtype)))}")
    lines.append(f"    return t{len(program) - 1}")
    exec("\n".join(lines), namespace)  # noqa: S102 (source made here from the program)
    signature = f"{dtype}({', '.join([dtype] * n_inputs)})"
    return numba.vectorize([signature], nopython=True)(namespace["f"])


def _expression(op: str, x: list[str], tie: str | None) -> str:
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
