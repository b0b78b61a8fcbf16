"""`take`: elements of a tensor at integer indices along one axis (embeddings, lookups).

`take(x, indices, axis)` is NumPy's `np.take`: the result's shape is
`x.shape[:axis] + indices.shape + x.shape[axis + 1:]`, negative indices count from the end,
and an index outside `-n..n-1` is an error when the task meets it (an ExecutionError naming
the index and the axis), never a clipped or wrapped value.

Chunking: the result's axes follow `x`'s axes before and after `axis` and the indices' axes,
so a task reads its block of indices and the part of `x` they select from, with `axis` whole.

Gradient with respect to `x`: the adjoint of a gather adds each result element back at its
index (a scatter-add). It is built here as a product with the one-hot matrix of the indices,
`one_hot(indices)^T @ g`, whose contraction over the indices is chunked and tree-summed like
any matmul's; it costs `len(indices) * n` multiply-adds per element of the other axes.
"""

from __future__ import annotations

import math

from deepx_flow.errors import GraphError, shown
from deepx_flow.ops.common import normalize_axis
from deepx_flow.ops.spec import GATHER, OpSpec


def _infer_take(node, inputs):
    x, indices = inputs
    if indices.dtype == "bool" or indices.dtype.startswith("float"):
        raise GraphError(f"take: indices must be integers, got {indices.dtype}", node.id)
    if x.ndim == 0:
        raise GraphError("take needs a tensor of at least 1 dimension to index", node.id)
    axis = node.attr("axis")
    if axis is None or normalize_axis(node, axis, x.ndim) != axis:
        raise GraphError(f"take: axis must be a non-negative axis of the {x.ndim}-D tensor, "
                         f"got {shown(axis)}", node.id)
    if x.shape[axis] == 0 and indices.size:
        raise GraphError(f"take: axis {axis} of {x.shape} is empty; there is nothing to take",
                         node.id)
    return x.shape[:axis] + indices.shape + x.shape[axis + 1:], x.dtype


def _take_vjp(e, node, inputs, g):
    """dx = one_hot(indices)^T @ g, arranged as (before, n, after) and reshaped back."""
    x, indices = inputs
    axis = node.attr("axis")
    n = x.shape[axis]
    before, after = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    m = indices.size
    # In int64, which holds any position (a uint8 index can select from 50,000 rows).
    flat = e("cast", e("reshape", indices, shape=(m,)), dtype="int64")
    # Negative indices count from the end: normalize before comparing with 0..n-1.
    flat = e("where", e("lt", flat, e.const(0, "int64")), e("add", flat, e.const(n, "int64")),
             flat)
    positions = e("arange", shape=(n,), dtype="int64", start=0, step=1)
    hot = e("cast", e("eq", e("reshape", flat, shape=(m, 1)), positions), dtype=g.dtype)
    rows = e("reshape", g, shape=(before, m, after))
    summed = e("matmul", e("transpose", hot, axes=(1, 0)), rows)  # (before, n, after)
    return e("reshape", summed, shape=x.shape), None


def specs() -> list[OpSpec]:
    return [OpSpec("take", GATHER, 2, _infer_take, attrs=("axis",), required_attrs=("axis",),
                   flops_per_element=1, vjp=_take_vjp,
                   doc="elements at integer indices along an axis (np.take)")]
