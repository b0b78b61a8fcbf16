"""Scans: `cumsum`, the running sums along one axis (`np.cumsum`, ONNX's CumSum).

`cumsum(x, axis, exclusive, reverse)`: position i of the result holds the sum of x's
elements along `axis` up to and including i (`exclusive`: up to but not including it, so the
first is 0); with `reverse` the sums run from the end instead. Result dtypes are NumPy's
(`np.cumsum`: bools and integers narrower than 64 bits sum in int64 or uint64, floats keep
their dtype). Float sums add up in float64 (`ir.dtypes.accumulator`) and are rounded to the
result's dtype once, as `sum` does: a float16, bfloat16 or float32 result is the float64
prefix sum rounded once, the same whatever the chunk grid (float16's prefix sums of up to
8,192 terms are exact in float64, so the result is the exact one rounded; bfloat16's too
where the terms' magnitudes span less than float64's precision, as data of one scale do).

Chunking (kind SCAN): the result is chunked like x on every axis, the scanned one included.
Along that axis the lowering (`compiler.lower`) gives each chunk its local prefix sums plus
the carry of the chunks before it: a task per chunk sums it (its total), a chain of small
tasks adds the totals up in scan order (the carry of each chunk, one cross-section of it),
and the chunk's own task scans it with the carry added in (`kernels/scan.py`), rounding
once. A plan has at most three tasks per chunk, and reads x twice where the axis is split
(the totals, then the scan): splitting that axis is the partitioner's last resort for
parallelism, after every other axis.

Gradient: the vector-Jacobian product of a scan is the scan of the cotangent in the other
direction (`exclusive` kept): each x[j] is added into every result position its sum covers.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.common import normalize_axis
from deepx_flow.ops.spec import SCAN, OpSpec


def _infer_cumsum(node, inputs):
    (x,) = inputs
    axis = node.attr("axis")
    if axis is None or normalize_axis(node, axis, x.ndim) != axis:
        raise GraphError(f"{node.op}: axis must be a non-negative axis of the {x.ndim}-D "
                         f"input, got {shown(axis)}", node.id)
    for flag in ("exclusive", "reverse"):
        if not isinstance(node.attr(flag), bool):
            raise GraphError(f"{node.op}: {flag} must be true or false, got "
                             f"{shown(node.attr(flag))}", node.id)
    return x.shape, dtypes.numpy_result(np.cumsum, [x.dtype])


def _cumsum_vjp(e, node, inputs, g):
    """The cotangent scanned the other way: y[i] = sum of x[j] over the j its sum covers, so
    x[j] receives g[i] from every i whose sum covers j."""
    return (e("cumsum", g, axis=node.attr("axis"), exclusive=node.attr("exclusive"),
              reverse=not node.attr("reverse")),)


def specs() -> list[OpSpec]:
    # Per element: the total's add, the scan's add and the rounding; the scan keeps a
    # float64 block of the chunk besides (`kernels/scan.py`), counted by the cost model.
    return [OpSpec("cumsum", SCAN, 1, _infer_cumsum, flops_per_element=2,
                   attrs=("axis", "exclusive", "reverse"),
                   required_attrs=("axis", "exclusive", "reverse"), vjp=_cumsum_vjp,
                   doc="running sums along an axis (np.cumsum; ONNX CumSum's exclusive, "
                       "reverse)")]
