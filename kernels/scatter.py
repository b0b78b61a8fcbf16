"""Kernels of the scatters and element gathers (`deepx_flow/ops/scatter.py`) on one block.

A task holds x's block with the axes the indices address whole, and the indices (and
updates) that write into or read from that block, in the block's own coordinates. So each
kernel is the operator's definition applied to its block, and pure: a scatter writes into a
copy of its block (or returns the block itself when nothing is written into it).

Every update's target becomes one flat position in the block (for scatter_nd, one row of
the block seen as (positions along the first k axes, the rest)), after its index is checked
against its axis: an index outside -n..n-1 is an ExecutionError naming it and the axis.

Reduction "none" with duplicate positions: the last update in C order wins, chosen
explicitly (the first occurrence of each position in the reversed list of positions, which
`unique(..., return_index=True)` gives), since neither NumPy's nor CuPy's fancy assignment
promises an order. The reductions go through `ufunc.at` on NumPy (unbuffered: every
duplicate is applied) and `cupyx.scatter_add/max/min` on CuPy; CuPy has no scatter product
(nor every dtype in the others), so those run on the host.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels import dispatch

UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_elements(x, indices, updates, axis: int, reduction: str):
    """ONNX ScatterElements on a block: x (its `axis` whole) with `updates` written at
    `indices` along `axis`; indices and updates may be shorter than x along other axes."""
    if indices.size == 0:
        return x
    xp = dispatch.array_module(x, indices, updates)
    index = checked_index(xp, indices, x.shape[axis], "scatter_elements", axis)
    out = x.copy()
    _write(xp, out.reshape(-1), _element_positions(xp, x.shape, index, axis),
           updates.reshape(-1), reduction)
    return out


def gather_elements(x, indices, axis: int):
    """np.take_along_axis on a block: x's block (its `axis` whole) and the indices' block,
    of one extent along every other axis."""
    xp = dispatch.array_module(x, indices)
    index = checked_index(xp, indices, x.shape[axis], "gather_elements", axis)
    return xp.take_along_axis(x, index, axis=axis)


def scatter_nd(x, indices, updates, reduction: str):
    """ONNX ScatterND on a block: x (its first k axes whole) with each row of `indices`
    (k positions) writing its block of `updates`."""
    k = indices.shape[-1]
    rows = math.prod(indices.shape[:-1])
    if rows == 0 or x.size == 0:
        return x
    xp = dispatch.array_module(x, indices, updates)
    out = x.copy()
    width = math.prod(x.shape[k:])
    positions = _row_positions(xp, x, indices, "scatter_nd")
    _write(xp, out.reshape(math.prod(x.shape[:k]), width), positions,
           updates.reshape(rows, width), reduction)
    return out


def gather_nd(x, indices):
    """ONNX GatherND (no batch axes) on a block: x's first k axes whole, the others cut to
    the block's last axes; the block's rows of indices."""
    xp = dispatch.array_module(x, indices)
    k = indices.shape[-1]
    table = x.reshape(math.prod(x.shape[:k]), math.prod(x.shape[k:]))
    picked = xp.take(table, _row_positions(xp, x, indices, "gather_nd"), axis=0)
    return picked.reshape(indices.shape[:-1] + x.shape[k:])


KERNELS = {"scatter_elements": scatter_elements, "gather_elements": gather_elements,
           "scatter_nd": scatter_nd, "gather_nd": gather_nd}


def checked_index(xp, index, n: int, op: str, axis: int):
    """`index` as int64 in 0..n-1; an ExecutionError names the first bound it passes."""
    index = index.astype(np.int64, copy=False)
    if index.size:
        low, high = int(index.min()), int(index.max())
        if low < -n or high >= n:
            bad = low if low < -n else high
            raise ExecutionError(f"{op}: index {bad} is out of range for axis {axis} of size "
                                 f"{n}")
    return xp.where(index < 0, index + n, index)


def _element_positions(xp, shape, index, axis: int):
    """The flat position in a block of `shape` of each entry of `index` (C order): its own
    coordinates, with the `axis` one replaced by its value."""
    strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    positions = index * strides[axis]
    for a in range(len(shape)):
        if a != axis and index.shape[a] > 1:
            along = [-1 if b == a else 1 for b in range(len(shape))]
            positions += xp.arange(index.shape[a], dtype=np.int64).reshape(along) * strides[a]
    return positions.reshape(-1)


def _row_positions(xp, x, indices, op: str):
    """Per row of `indices` (k positions along x's first k axes), its row number in x seen
    as (prod(x.shape[:k]), the rest)."""
    k = indices.shape[-1]
    rows = indices.reshape(-1, k)
    positions = xp.zeros(rows.shape[0], dtype=np.int64)
    for j in range(k):
        positions *= x.shape[j]
        positions += checked_index(xp, rows[:, j], x.shape[j], op, j)
    return positions


def _write(xp, target, positions, values, reduction: str) -> None:
    """target[positions] (op)= values, in place; rows of `values` when target is 2-D."""
    if reduction == "none":
        # The last update of each position wins: its first occurrence when reversed.
        n = positions.shape[0]
        _, first = xp.unique(positions[::-1], return_index=True)
        last = n - 1 - first
        target[positions[last]] = values[last]
        return
    if xp is not np:
        import cupyx
        scatter = {"add": getattr(cupyx, "scatter_add", None),
                   "max": getattr(cupyx, "scatter_max", None),
                   "min": getattr(cupyx, "scatter_min", None)}.get(reduction)
        if scatter is not None:
            try:
                scatter(target, positions, values)
                return
            except TypeError:  # a dtype CuPy's atomics lack: on the host below
                pass
        host = dispatch.to_host(target)
        UFUNCS[reduction].at(host, dispatch.to_host(positions), dispatch.to_host(values))
        target[...] = xp.asarray(host)
        return
    UFUNCS[reduction].at(target, positions, values)
