"""Sums over the leading rows of an exact program, compiled to one loop with numba.

A reduction's prologue through NumPy (`tasks._reduce_blocks`) is an instruction at a time
over a block of rows, then a cast of the block to the accumulator's dtype, then NumPy's
reduce: five or six passes over each block, and on a column standardization's chunks they
were most of its time (a sum of (x - m)**2 over 128 MiB of float32: 63 ms, compiled 19 ms;
((x - m) / s)**3: 106 ms, compiled 21 ms). Here the whole of it (the program, the cast, the
adding up) is one loop over each row.

The result is `tasks._reduce_by_rows`'s to the bit: the same blocks of rows, each summed row
after row from its first row's values, the blocks' sums added into the total in order (the
first one plus 0, as NumPy's reduce starts a sum). So the programs are those whose every
instruction rounds once, whatever the order (`fused_numba`'s exact operations, and division,
IEEE's too; with numba's NumPy error model a division by zero gives inf or NaN as NumPy does,
not an exception); instructions that read only values every row shares (a mean, the square
root of a variance: `fused_cpu.hoisted`) are computed once by NumPy, whatever they are, and
read as operands.

Taken where the sum is over the first axis longer than 1 (a column sum, the leading axis of a
3-D tensor), with more than one value left (one is a sum along the rows, which NumPy adds
pairwise), and every operand, seen as (rows, the rest flattened), is contiguous and spans
all of the rows or none and all of the rest or none. Anything else returns None, and the
NumPy path does it.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.ir.program import Program
from deepx_flow.kernels import compiled, fused_numba, zero_ties

EXACT_OPS = fused_numba.EXACT_OPS | {"div"}
_CACHE_MAX = 64
_kernels: dict = {}


def column_sums(program: Program, arrays, fixed: dict, space_shape, axes, acc_dtype,
                block_rows: int) -> np.ndarray | None:
    """The sum over `axes` (dims kept) of `program` on `arrays` (broadcast to `space_shape`;
    an empty program is its first input), added up in `acc_dtype` (None: the values' dtype)
    in blocks of `block_rows` rows as `tasks._reduce_by_rows` adds them; `fixed`: instruction
    index -> its value, the same for every row (`fused_cpu.hoisted`). None where this module
    does not take it (see the module's docstring)."""
    shape = tuple(int(n) for n in space_shape)
    axis = next((a for a, n in enumerate(shape) if n > 1), None)
    reduced = {a % len(shape) for a in ((axes,) if isinstance(axes, int) else axes)}
    if axis is None or {a for a in reduced if shape[a] > 1} != {axis} or \
            not compiled.allowed():
        return None
    if any(not np.asarray(a).dtype.isnative for a in arrays):  # numba takes native only
        return None
    dtype = program[-1][2] if program else arrays[0].dtype.name
    acc = np.dtype(acc_dtype or dtype)
    if not _exact(program, fixed, dtype, [arrays[k].dtype.name for k in _read(program)])\
            or acc.name not in fused_numba.DTYPES:
        return None
    rows, rest = shape[axis], math.prod(shape[axis + 1:])
    if rest == 1:  # NumPy's reduce then runs along the rows, pairwise: not these bits
        return None
    operands = [arrays[k] for k in _read(program)] + [fixed[j] for j in sorted(fixed)]
    views, patterns = [], []
    for a in operands:
        seen = _as_rows(np.asarray(a), shape, axis, rows, rest)
        if seen is None:
            return None
        views.append(seen[0])
        patterns.append(seen[1])
    kernel = _kernel(program, tuple(sorted(fixed)), tuple(patterns), acc.name)
    total = np.empty(rest, acc)
    kernel(*views, total, rows, max(1, int(block_rows)))
    return total.reshape(tuple(1 if a in reduced else n for a, n in enumerate(shape)))


def _read(program: Program) -> list[int]:
    """The inputs the program reads, in order (an empty program reads its first)."""
    if not program:
        return [0]
    return sorted({a[1] for _, args, _ in program for a in args if a[0] == "in"})


def _exact(program: Program, fixed: dict, dtype: str, in_dtypes) -> bool:
    """Whether every instruction not in `fixed` is exact, on `dtype` throughout."""
    if dtype not in fused_numba.DTYPES or any(d != dtype for d in in_dtypes):
        return False
    for j, (op, args, out_dtype) in enumerate(program):
        if j in fixed:
            if np.asarray(fixed[j]).dtype.name != dtype:
                return False
            continue
        if op not in EXACT_OPS or out_dtype != dtype:
            return False
        if op in ("maximum", "minimum", "relu") and zero_ties.rule(op, dtype) is None:
            return False
        if any(a[0] == "c" and (a[2] != dtype or not fused_numba.finite(a[1], dtype))
               for a in args):
            return False
    return True


def _as_rows(a: np.ndarray, shape, axis: int, rows: int, rest: int):
    """`a`, broadcasting to `shape`, as a (rows, rest) or (1, rest) or (rows, 1) or (1, 1)
    contiguous view and which of the two it spans; None for any other broadcasting."""
    dims = (1,) * (len(shape) - a.ndim) + tuple(a.shape)
    if any(n != 1 for n in dims[:axis]) or not a.flags.c_contiguous:
        return None
    tail = dims[axis + 1:]
    spans_rest = tail == tuple(shape[axis + 1:]) and rest > 1
    if not spans_rest and any(n != 1 for n in tail) or dims[axis] not in (1, rows):
        return None
    spans_rows = dims[axis] == rows and rows > 1
    return a.reshape(rows if spans_rows else 1, rest if spans_rest else 1), \
        (spans_rows, spans_rest)


def _kernel(program: Program, fixed: tuple, patterns: tuple, acc: str):
    # repr: 0.0 and -0.0 are equal keys of a dict, but not the same program
    key = (repr(program), fixed, patterns, acc)
    found = _kernels.get(key)
    if found is None:
        if len(_kernels) >= _CACHE_MAX:
            _kernels.clear()
        found = _kernels[key] = _compile(program, fixed, patterns, acc)
    return found


def _compile(program: Program, fixed: tuple, patterns: tuple, acc: str):
    """The loop, written from the program and compiled (in each process: numba caches no
    function made by exec on disk): per block of rows, its first row's values, then each
    next row's added, then the block added into the total."""
    import numba
    n = len(patterns)
    read = _read(program)
    names = [f"in{i}" for i in range(n)]
    namespace = {"ACC": getattr(np, acc), "np": np}
    dtype = program[-1][2] if program else None
    scalar = getattr(np, dtype) if dtype else None
    if scalar is not None:
        namespace["ZERO"] = scalar(0)

    def body(row: str, indent: str) -> list[str]:
        """The statements that compute row `row`'s value at column p, as `value`."""
        at = [f"{names[i]}[{row if r else 0}, {'p' if c else 0}]"
              for i, (r, c) in enumerate(patterns)]
        if not program:
            return [f"{indent}value = ACC({at[0]})"]
        lines = []
        for j, (op, args, _) in enumerate(program):
            if j in fixed:
                lines.append(f"{indent}t{j} = {at[n - len(fixed) + fixed.index(j)]}")
                continue
            operands = []
            for a in args:
                if a[0] == "in":
                    operands.append(at[read.index(a[1])])
                elif a[0] == "t":
                    operands.append(f"t{a[1]}")
                else:
                    name = f"k{len(namespace)}"
                    namespace[name] = scalar(a[1])
                    operands.append(name)
            expression = f"{operands[0]} / {operands[1]}" if op == "div" else \
                fused_numba.expression(op, operands, zero_ties.rule(op, dtype))
            lines.append(f"{indent}t{j} = {expression}")
        lines.append(f"{indent}value = ACC(t{len(program) - 1})")
        return lines

    lines = [f"def kernel({', '.join(names)}, total, rows, block):",
             "    rest = total.shape[0]",
             "    part = np.empty(rest, total.dtype)",
             "    for lo in range(0, rows, block):",
             "        hi = min(lo + block, rows)",
             "        for p in range(rest):",
             *body("lo", "            "),
             "            part[p] = value",
             "        for r in range(lo + 1, hi):",
             "            for p in range(rest):",
             *body("r", "                "),
             "                part[p] += value",
             "        if lo == 0:",
             "            for p in range(rest):",
             "                total[p] = part[p] + ACC(0)",
             "        else:",
             "            for p in range(rest):",
             "                total[p] += part[p]"]
    exec("\n".join(lines), namespace)  # noqa: S102 (source made here from the program)
    return numba.njit(nogil=True, boundscheck=False, error_model="numpy")(namespace["kernel"])
