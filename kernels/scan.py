"""The scan kernel: a chunk's running sums along one axis, with the carry of the chunks before
it added in (`ops/scan.py`), for NumPy and CuPy arrays alike.

Sums add up in the accumulator dtype (`ir.dtypes.accumulator`: float64 for floats, the
result's own integer dtype otherwise) and are rounded to the result's dtype once. The carry
is the sum of everything before the chunk in scan order, in the accumulator dtype; it is
added to the chunk's first element before the scan, so each result is the running sum from
the start of the axis in one left-to-right order.

How (NumPy): the chunk is viewed as (P, N, Q), N the scanned axis, and worked through in
blocks of about `BLOCK_ELEMENTS` (several whole lines of P, or rows along N with the running
sum carried from block to block), each cast into one reused accumulator block (in place in
the result where the result has the accumulator's dtype), scanned there and rounded into the
result: no chunk-sized temporary (fresh memory faults in page by page on a Dask worker, see
`kernels/tasks.py`). NumPy's `cumsum` along an axis other than the last is a slow strided
loop (a (2000, 8000) float64 chunk along axis 0: 108-180 ms), so where a row holds enough
elements the scan is one vector add per row instead (30 ms); along the last axis it is
`cumsum` (60 ms; measured on the 2-core EPYC of benchmarks/results).

CuPy: `cupy.cumsum` of each block into the accumulator dtype (blocks of `GPU_BLOCK_ELEMENTS`,
so a few launches per chunk), the carry added, rounded into the result. No kernel is
generated here.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import ExecutionError
from deepx_flow.ir.dtypes import accumulator
from deepx_flow.kernels import bfloat16, dispatch, recycled

BLOCK_ELEMENTS = 1 << 18
GPU_BLOCK_ELEMENTS = 1 << 22
# Rows (the axes after the scanned one) this long are scanned by one vector add per row
# rather than by `np.cumsum`.
ROW_ADD_ELEMENTS = 32


def scratch_elements(shape, axis: int) -> int:
    """The most accumulator elements a scan of a chunk of `shape` holds besides its operand
    and result (either engine's block): the working-set model's figure (`compiler.costs`)."""
    q = math.prod(shape[axis + 1:])
    return min(math.prod(shape), max(GPU_BLOCK_ELEMENTS, q))


def scan(x, axis: int, exclusive: bool, reverse: bool, dtype: str, carry=None):
    """The running sums of `x` along `axis`, in `dtype`, each plus `carry`.

    Parameters
    ----------
    x : array
        The chunk (NumPy or CuPy).
    axis : int
        The scanned axis (non-negative).
    exclusive, reverse : bool
        Leave each element out of its own sum; sum from the end.
    dtype : str
        The result's dtype (`np.cumsum`'s for x's).
    carry : array, optional
        The sum of what comes before the chunk in scan order: x's shape with 1 along
        `axis`, in the accumulator dtype of `dtype`; None for the first chunk.
    """
    xp = dispatch.array_module(x, carry)
    acc = accumulator(dtype)
    out = recycled.empty(x.shape, dtype) if xp is np else xp.empty(x.shape, dtype)
    if x.size == 0:
        return out
    src, dst = x, out
    if reverse:
        src, dst = xp.flip(src, axis), xp.flip(dst, axis)
    if exclusive:  # the first holds the carry alone; the others the sums up to the one before
        first = dst[_along(axis, slice(0, 1))]
        _round_into(xp, first, carry if carry is not None else xp.zeros(first.shape, acc))
        src, dst = src[_along(axis, slice(0, -1))], dst[_along(axis, slice(1, None))]
        if dst.shape[axis] == 0:
            return out
    p, n = math.prod(src.shape[:axis]), src.shape[axis]
    q = math.prod(src.shape[axis + 1:])
    # src may be a copy when it is not contiguous enough (a transposed view); dst never is
    src3 = src.reshape(p, n, q)
    dst3 = _view(xp, dst, (p, n, q))
    carry3 = None if carry is None else carry.reshape(p, 1, q)
    _scan_blocks(xp, src3, dst3, carry3, acc)
    return out


def _along(axis: int, index: slice) -> tuple:
    return (slice(None),) * axis + (index,)


def _view(xp, a, shape):
    """`a` reshaped without a copy (the result is written through it). A flipped or shifted
    view of a C-ordered array merges the axes before the scanned one, and those after it,
    without one; anything else would be a bug here, raised rather than written elsewhere."""
    if xp is np:
        return np.reshape(a, shape, copy=False)
    out = a.reshape(shape)
    if out.data.ptr != a.data.ptr:
        raise ExecutionError(f"scan: a view of shape {a.shape} reshaped to {shape} was copied")
    return out


def _round_into(xp, dst, values) -> None:
    """`dst[...] = values`, rounded once to dst's dtype (correctly for bfloat16; past a
    float16's range to infinity, silently, as every kernel here)."""
    if xp is np:
        with np.errstate(over="ignore", invalid="ignore"):
            bfloat16.copyto(dst, values)
    else:
        dst[...] = values


def _scan_blocks(xp, src, dst, carry, acc: str) -> None:
    """dst[p, n, q] = carry[p, 0, q] + src[p, 0, q] + ... + src[p, n, q], block by block.
    Blocks are whole lines (a range of p) where a line fits a block, else rows along n with
    the running sum carried between them."""
    p, n, q = src.shape
    limit = BLOCK_ELEMENTS if xp is np else GPU_BLOCK_ELEMENTS
    in_place = xp is np and dst.dtype == acc  # the result itself is the accumulator
    if n * q <= limit:
        lines = min(p, max(1, limit // max(1, n * q)))
        blocks = [(slice(p0, min(p, p0 + lines)), slice(0, n)) for p0 in range(0, p, lines)]
        largest = (lines, n, q)
    else:
        rows = min(n, max(1, limit // q))
        blocks = [(slice(p0, p0 + 1), slice(n0, min(n, n0 + rows))) for p0 in range(p)
                  for n0 in range(0, n, rows)]
        largest = (1, rows, q)
    scratch = np.empty(largest, acc) if xp is np and not in_place else None
    running = None
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are values here
        for block in blocks:
            if block[1].start == 0:  # a block of new lines: their carry
                running = None if carry is None else carry[block[0]]
            running = _scan_block(xp, src, dst, running, acc, block, scratch)


def _scan_block(xp, src, dst, running, acc: str, block, scratch):
    """One block of `_scan_blocks`: its sums, `running` (what comes before it, or None)
    added to its first row, rounded into `dst` (computed there where `scratch` is None on
    NumPy); returns its last row of sums, the running sum of the block after it."""
    if xp is not np:
        work = xp.cumsum(src[block], axis=1, dtype=acc)
        if running is not None:
            work += running
    else:
        work = dst[block] if scratch is None else \
            scratch[:block[0].stop - block[0].start, :block[1].stop - block[1].start]
        np.copyto(work, src[block], casting="unsafe")
        if running is not None:
            work[:, :1] += running
        _scan_in_place(work)
    if xp is not np or scratch is not None:
        _round_into(xp, dst[block], work)
    return work[:, -1:].copy()


def _scan_in_place(work: np.ndarray) -> None:
    """Running sums along axis 1 of a (P, N, Q) NumPy block, in place: a vector add per row
    where rows are contiguous runs of Q, else NumPy's loop (along the last axis, Q is 1)."""
    if work.shape[2] >= ROW_ADD_ELEMENTS:
        for i in range(1, work.shape[1]):
            np.add(work[:, i - 1], work[:, i], out=work[:, i])
    else:
        np.cumsum(work, axis=1, out=work)
