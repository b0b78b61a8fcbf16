"""Scatters and element gathers: values written or read at computed positions.

`scatter_elements(x, indices, updates, axis, reduction)` is ONNX's ScatterElements (NumPy's
`np.put_along_axis`, and `ufunc.at` for the reductions): a copy of `x` where each update
goes to its own position with the `axis` coordinate replaced by its index,
`out[..., indices[i, j, ...], ...] (op)= updates[i, j, ...]`. `indices` and `updates` have
x's rank and one shape; along the other axes they may be shorter than `x` (then only that
leading region of x is written). `gather_elements(x, indices, axis)` is its reading half,
ONNX's GatherElements and `np.take_along_axis`: `out[i, j, ...] = x[..., indices[i, j, ...],
...]`, of the indices' shape.

`scatter_nd(x, indices, updates, reduction)` is ONNX's ScatterND: the last axis of
`indices` (of length k) holds positions along x's first k axes, and each of its rows writes
a block `updates[row]` of shape `x.shape[k:]`. `gather_nd(x, indices)` reads those blocks
(ONNX's GatherND without batch axes).

Reductions: "none" (assign), "add", "mul", "max", "min". Negative indices count from the
end; an index outside `-n..n-1` is an ExecutionError naming it and the axis when the task
meets it, never clipped or wrapped. Duplicate indices with "none", which ONNX leaves
undefined, are defined here: the last update in C order of the indices wins, on every chunk
grid and device (the kernels pick it explicitly; `kernels/scatter.py`). With a reduction
every update is applied: on NumPy in C order of the indices, so the same on every chunk
grid; on CuPy in the order its atomic operations meet (float sums may differ in the last
bits).

Chunking (the `Tiling` of each): a scatter's result is chunked like `x`, except the axes its
positions address, which each task holds whole (`axis`; a scatter_nd's first k axes); a task
reads its block of x and the part of `indices` and `updates` that writes into it (none at
all for a block beyond the indices' extent: it passes x through). An element gather's
result is chunked like its indices; a task reads its block of indices and the block of x
they select from, with the addressed axes whole.

Gradients: a scatter-add passes `g` to x and gathers it for the updates; an assignment
passes `g` to x with the written positions zeroed and gathers it for the updates, only the
winning update of a duplicated position receiving it (it alone shows in the result); a gather
scatter-adds `g` back. "mul", "max" and "min" have no gradient rule: differentiating through
them is a GraphError naming the node.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ops.common import normalize_axis
from deepx_flow.ops.spec import INDEXED, OpSpec, Tiling

REDUCTIONS = ("none", "add", "mul", "max", "min")


# -- type rules ----------------------------------------------------------------------------
def _check_indices(node, indices) -> None:
    if np.dtype(indices.dtype).kind not in "iu":
        raise GraphError(f"{node.op}: indices must be integers, got {indices.dtype}", node.id)


def _check_axis(node, x) -> int:
    if x.ndim == 0:
        raise GraphError(f"{node.op} needs a tensor of at least 1 dimension to index", node.id)
    axis = node.attr("axis")
    if axis is None or normalize_axis(node, axis, x.ndim) != axis:
        raise GraphError(f"{node.op}: axis must be a non-negative axis of the {x.ndim}-D "
                         f"tensor, got {shown(axis)}", node.id)
    return axis


def _check_updates(node, x, updates, shape) -> None:
    reduction = node.attr("reduction")
    if reduction not in REDUCTIONS:
        raise GraphError(f"{node.op}: reduction must be one of {', '.join(REDUCTIONS)}, got "
                         f"{shown(reduction)}", node.id)
    if updates.shape != tuple(shape):
        raise GraphError(f"{node.op}: updates of shape {updates.shape} for indices that write "
                         f"{tuple(shape)}", node.id)
    if updates.dtype != x.dtype:
        raise GraphError(f"{node.op}: updates are {updates.dtype} but x is {x.dtype}; cast "
                         "one to the other", node.id)


def _check_elements(node, x, indices) -> int:
    """The checks scatter_elements and gather_elements share; returns the axis."""
    _check_indices(node, indices)
    axis = _check_axis(node, x)
    if indices.ndim != x.ndim:
        raise GraphError(f"{node.op}: indices of rank {indices.ndim} for a {x.ndim}-D tensor; "
                         "they must have its rank", node.id)
    over = [a for a in range(x.ndim) if a != axis and indices.shape[a] > x.shape[a]]
    if over:
        raise GraphError(f"{node.op}: indices {indices.shape} reach past x {x.shape} along "
                         f"axis {over[0]} (only axis {axis} holds positions)", node.id)
    if x.shape[axis] == 0 and indices.size:
        raise GraphError(f"{node.op}: axis {axis} of {x.shape} is empty; no index can point "
                         "into it", node.id)
    return axis


def _check_nd(node, x, indices) -> int:
    """The checks scatter_nd and gather_nd share; returns k, the axes a row addresses."""
    _check_indices(node, indices)
    k = indices.shape[-1] if indices.ndim else 0
    if not 1 <= k <= x.ndim:
        raise GraphError(f"{node.op}: the last axis of indices {indices.shape} holds positions "
                         f"along x's first axes; it must have 1 to {x.ndim} entries for x "
                         f"{x.shape}", node.id)
    if 0 in x.shape[:k] and indices.size:
        raise GraphError(f"{node.op}: x {x.shape} is empty along an axis the indices point "
                         "into", node.id)
    return k


def _infer_scatter_elements(node, inputs):
    x, indices, updates = inputs
    _check_elements(node, x, indices)
    _check_updates(node, x, updates, indices.shape)
    return x.shape, x.dtype


def _infer_gather_elements(node, inputs):
    x, indices = inputs
    _check_elements(node, x, indices)
    return indices.shape, x.dtype


def _infer_scatter_nd(node, inputs):
    x, indices, updates = inputs
    k = _check_nd(node, x, indices)
    _check_updates(node, x, updates, indices.shape[:-1] + x.shape[k:])
    return x.shape, x.dtype


def _infer_gather_nd(node, inputs):
    x, indices = inputs
    k = _check_nd(node, x, indices)
    return indices.shape[:-1] + x.shape[k:], x.dtype


# -- tilings -------------------------------------------------------------------------------
# Operand positions: 0 is x, 1 the indices, 2 the updates.
def _whole(t):
    return tuple((0, s) for s in t.shape)


def _scatter_elements_aligned(node, ins):
    """x is chunked like the result; indices and updates too, except along `axis`."""
    axis = node.attr("axis")
    return [(0, a, a) for a in range(node.ndim)] + [
        (p, a, a) for p in (1, 2) for a in range(node.ndim) if a != axis]


def _scatter_elements_regions(node, ins, region):
    """x's block; of indices and updates, the part inside both the block and their extent
    (empty past it), with `axis` whole."""
    axis, shape = node.attr("axis"), ins[1].shape
    written = tuple((0, s) if a == axis else (min(lo, s), min(hi, s))
                    for a, ((lo, hi), s) in enumerate(zip(region, shape)))
    return [region, written, written]


def _gather_elements_aligned(node, ins):
    axis = node.attr("axis")
    return [(1, a, a) for a in range(node.ndim)] + [
        (0, a, a) for a in range(node.ndim) if a != axis]


def _gather_elements_regions(node, ins, region):
    """The indices' block, and x's block with `axis` whole."""
    axis = node.attr("axis")
    return [tuple((0, ins[0].shape[a]) if a == axis else r for a, r in enumerate(region)),
            region]


def _nd(ins) -> tuple[int, int]:
    """(k: the x axes an index row addresses, the number of index rows' axes)."""
    return ins[1].shape[-1], ins[1].ndim - 1


def _scatter_nd_aligned(node, ins):
    """x is chunked like the result; the updates' block axes like the result's last ones."""
    k, lead = _nd(ins)
    return [(0, a, a) for a in range(node.ndim)] + [
        (2, lead + a - k, a) for a in range(k, node.ndim)]


def _scatter_nd_regions(node, ins, region):
    """x's block; the indices whole; every row of updates, cut to the block's last axes."""
    k, _ = _nd(ins)
    return [region, _whole(ins[1]), _whole(ins[1])[:-1] + region[k:]]


def _gather_nd_aligned(node, ins):
    k, lead = _nd(ins)
    return [(1, j, j) for j in range(lead)] + [
        (0, a, lead + a - k) for a in range(k, ins[0].ndim)]


def _gather_nd_regions(node, ins, region):
    """x with its first k axes whole and its others cut like the block's last ones; the
    block's rows of indices."""
    k, lead = _nd(ins)
    return [_whole(ins[0])[:k] + region[lead:], region[:lead] + ((0, k),)]


SCATTER_ELEMENTS = Tiling(_scatter_elements_aligned, lambda node, ins: (node.attr("axis"),),
                          _scatter_elements_regions)
GATHER_ELEMENTS = Tiling(_gather_elements_aligned, lambda node, ins: (),
                         _gather_elements_regions)
SCATTER_ND = Tiling(_scatter_nd_aligned, lambda node, ins: tuple(range(_nd(ins)[0])),
                    _scatter_nd_regions)
GATHER_ND = Tiling(_gather_nd_aligned, lambda node, ins: (), _gather_nd_regions)


# -- gradients -----------------------------------------------------------------------------
def _no_gradient(node):
    return GraphError(f"{node.op} with reduction {shown(node.attr('reduction'))} has no "
                      "gradient rule here (only 'add' and 'none' do); differentiate a graph "
                      "that scatters with those", node.id)


def _positions(e, shape):
    """0, 1, 2, ... in `shape` (the indices', or their rows' for `nd`): which update each
    is, in C order."""
    return e("reshape", e("arange", shape=(math.prod(shape),), dtype="int64", start=0,
                          step=1), shape=tuple(shape))


def _scatter_elements_vjp(e, node, inputs, g):
    x, indices, updates = inputs
    axis, reduction = node.attr("axis"), node.attr("reduction")
    if reduction not in ("add", "none"):
        raise _no_gradient(node)
    picked = e("gather_elements", g, indices, axis=axis)
    if reduction == "add":
        return g, None, picked
    dx = e("scatter_elements", g, indices, e.zeros(updates.shape, g.dtype), axis=axis,
           reduction="none")
    # Which update won each written position: scatter the updates' own numbers, read back.
    ids = _positions(e, indices.shape)
    owner = e("scatter_elements", e("full", shape=x.shape, dtype="int64", value=-1), indices,
              ids, axis=axis, reduction="none")
    won = e("eq", e("gather_elements", owner, indices, axis=axis), ids)
    return dx, None, e("where", won, picked, e.const(0, g.dtype))


def _scatter_nd_vjp(e, node, inputs, g):
    x, indices, updates = inputs
    reduction = node.attr("reduction")
    if reduction not in ("add", "none"):
        raise _no_gradient(node)
    picked = e("gather_nd", g, indices)
    if reduction == "add":
        return g, None, picked
    k = indices.shape[-1]
    dx = e("scatter_nd", g, indices, e.zeros(updates.shape, g.dtype), reduction="none")
    rows = indices.shape[:-1]
    ids = _positions(e, rows)
    owner = e("scatter_nd", e("full", shape=x.shape[:k], dtype="int64", value=-1), indices,
              ids, reduction="none")
    won = e("eq", e("gather_nd", owner, indices), ids)
    won = e("reshape", won, shape=rows + (1,) * (x.ndim - k))
    return dx, None, e("where", won, picked, e.const(0, g.dtype))


def _gather_elements_vjp(e, node, inputs, g):
    x, indices = inputs
    return e("scatter_elements", e.zeros(x.shape, g.dtype), indices, g,
             axis=node.attr("axis"), reduction="add"), None


def _gather_nd_vjp(e, node, inputs, g):
    x, indices = inputs
    return e("scatter_nd", e.zeros(x.shape, g.dtype), indices, g, reduction="add"), None


def specs() -> list[OpSpec]:
    return [
        OpSpec("scatter_elements", INDEXED, 3, _infer_scatter_elements,
               attrs=("axis", "reduction"), required_attrs=("axis", "reduction"),
               flops_per_element=1, vjp=_scatter_elements_vjp, tiling=SCATTER_ELEMENTS,
               doc="x with updates written at indices along an axis (ONNX ScatterElements)"),
        OpSpec("gather_elements", INDEXED, 2, _infer_gather_elements, attrs=("axis",),
               required_attrs=("axis",), flops_per_element=1, vjp=_gather_elements_vjp,
               tiling=GATHER_ELEMENTS,
               doc="elements at indices along an axis, per position (np.take_along_axis)"),
        OpSpec("scatter_nd", INDEXED, 3, _infer_scatter_nd, attrs=("reduction",),
               required_attrs=("reduction",), flops_per_element=1, vjp=_scatter_nd_vjp,
               tiling=SCATTER_ND,
               doc="x with blocks of updates written at index tuples (ONNX ScatterND)"),
        OpSpec("gather_nd", INDEXED, 2, _infer_gather_nd, flops_per_element=1,
               vjp=_gather_nd_vjp, tiling=GATHER_ND,
               doc="blocks of x at index tuples along its first axes (ONNX GatherND)"),
    ]
