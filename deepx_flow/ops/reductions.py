"""Reductions (sum, mean, max, min over axes) and the whole-axis softmax operators.

Reductions keep `axes` as a sorted tuple of non-negative ints (all axes when the SDK was given
None) and `keepdims` as a bool, so the YAML form is explicit. Result dtypes are NumPy's
(summing int32 gives int64, a mean of ints is float64); float sums add up in float64 whatever
their result dtype (`ir.dtypes.accumulator`, see `compiler.lower`).
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir.node import Node
from deepx_flow.ops.common import broadcast, normalize_axes, normalize_axis, ufunc_dtype
from deepx_flow.ops.programs import program_dtype
from deepx_flow.ops.spec import AXIS_WHOLE, REDUCE, OpSpec

REDUCTIONS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _reduced_operand(node, inputs):
    """The tensor being reduced: the single input, or what the prologue computes from all."""
    program = node.attr("prologue")
    if program is None:
        if len(inputs) != 1:
            raise GraphError(f"{node.op} takes 1 input, got {len(inputs)}", node.id)
        return inputs[0]
    from deepx_flow.ops import OPS
    shape = broadcast(node, [t.shape for t in inputs])
    return Node(node.id, "fused", (), shape,
                program_dtype(node, "prologue", program, inputs, OPS, len(shape)))


def _infer_reduce(node, inputs):
    a = _reduced_operand(node, inputs)
    axes = node.attr("axes")
    if not isinstance(axes, tuple) or normalize_axes(node, axes, a.ndim) != axes:
        raise GraphError(f"{node.op}: axes must be a sorted list of axes of the {a.ndim}-D "
                         f"input, got {shown(axes)}", node.id)
    keepdims = node.attr("keepdims", False)
    if not isinstance(keepdims, bool):
        raise GraphError(f"{node.op}: keepdims must be true or false", node.id)
    if node.op in ("max", "min") and any(a.shape[ax] == 0 for ax in axes):
        raise GraphError(f"{node.op} of an empty axis has no identity", node.id)
    shape = tuple(1 if i in axes else s for i, s in enumerate(a.shape) if keepdims or i not in axes)
    fn = REDUCTIONS[node.op]
    try:
        dtype = np.dtype(fn(np.ones((1,) * a.ndim, dtype=a.dtype), axis=tuple(axes)).dtype).name
    except TypeError:
        raise GraphError(f"{node.op} is not defined for dtype {a.dtype}", node.id) from None
    return shape, dtype


def _infer_softmax(node, inputs):
    (a,) = inputs
    axis = node.attr("axis")
    if axis is None or normalize_axis(node, axis, a.ndim) != axis or a.ndim == 0:
        raise GraphError(f"{node.op}: axis must be a non-negative axis of the {a.ndim}-D input,"
                         f" got {shown(axis)}", node.id)
    return a.shape, ufunc_dtype(node, np.exp, [a.dtype])


def specs() -> list[OpSpec]:
    out = [OpSpec(name, REDUCE, None, _infer_reduce, attrs=("axes", "keepdims", "prologue"),
                  required_attrs=("axes",), doc=f"{name} over axes")
           for name in REDUCTIONS]
    for name in ("softmax", "log_softmax"):
        out.append(OpSpec(name, AXIS_WHOLE, 1, _infer_softmax, flops_per_element=15,
                          temp_bytes_per_element=8, attrs=("axis",), required_attrs=("axis",),
                          doc=f"{name} along one axis (kept whole in each chunk)"))
    return out
