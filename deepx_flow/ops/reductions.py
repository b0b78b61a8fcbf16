"""Reductions (sum, mean, prod, max, min over axes) and the whole-axis softmax operators.

Reductions keep `axes` as a sorted tuple of non-negative ints (all axes when the SDK was given
None) and `keepdims` as a bool, so the YAML form is explicit. Result dtypes are NumPy's
(summing int32 gives int64, a mean of ints is float64); float sums and products add up in
float64 whatever their result dtype (`ir.dtypes.accumulator`, see `compiler.lower`), so a
float32 product that passes float32's range on the way but not at the end is still right.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node
from deepx_flow.ops.common import broadcast, normalize_axes, normalize_axis, ufunc_dtype
from deepx_flow.ops.programs import program_dtype
from deepx_flow.ops.registry import OPS
from deepx_flow.ops.spec import AXIS_WHOLE, REDUCE, OpSpec

REDUCTIONS = {"sum": np.sum, "mean": np.mean, "prod": np.prod, "max": np.max, "min": np.min}
# Those whose partials are kept in `dtypes.accumulator(result dtype)`, and how partials combine.
ACCUMULATED = ("sum", "mean", "prod")
COMBINE = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "max", "min": "min"}


def _reduced_operand(node, inputs):
    """The tensor being reduced: the single input, or what the prologue computes from all."""
    program = node.attr("prologue")
    if program is None:
        if len(inputs) != 1:
            raise GraphError(f"{node.op} takes 1 input, got {len(inputs)}", node.id)
        return inputs[0]
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
        dtype = dtypes.numpy_result(lambda x: fn(x, axis=tuple(axes)), [a.dtype], (1,) * a.ndim)
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


# -- gradient rules (see ops.elementwise for the conventions) ------------------------------
def _reduce_vjp(e, node, inputs, g):
    """sum: `g` broadcast back over the reduced axes; mean: the same over their count;
    prod: `g` times the product of the other elements; max/min: `g` to the elements equal to
    the result, split evenly between ties."""
    (x,) = inputs
    axes, keepdims = node.attr("axes"), node.attr("keepdims", False)
    gk = e.keep_dims(g, x.shape, axes, keepdims)
    if node.op == "sum":
        return (e.broadcast_to(gk, x.shape),)
    if node.op == "mean":
        count = float(math.prod(x.shape[a] for a in axes))
        if count > float(dtypes.finfo(g.dtype).max):  # a float16 gradient of a mean of 65,505+
            share = e("cast", e("div", e("cast", gk, dtype="float32"),
                                e.const(count, "float32")), dtype=g.dtype)
        else:
            share = e("div", gk, e.const(count, g.dtype))
        return (e.broadcast_to(share, x.shape),)
    if node.op == "prod":
        return (_prod_vjp(e, x, axes, gk),)
    hit = e("eq", x, e.keep_dims(node, x.shape, axes, keepdims))
    ties = e.sum(e("cast", hit, dtype=g.dtype), axes, keepdims=True)
    return (e("where", hit, e("div", gk, ties), e.const(0, g.dtype)),)


def _prod_vjp(e, x, axes, gk):
    """d prod / d x_i is the product of the other elements. Not prod / x_i, which is NaN at a
    zero: with no zero among them it is that quotient; with exactly one, the product of the
    nonzero elements at the zero and 0 elsewhere; with two or more, 0 everywhere."""
    dt = x.dtype
    zero, one = e.const(0, dt), e.const(1, dt)
    is_zero = e("eq", x, zero)
    nonzero_prod = e("prod", e("where", is_zero, one, x), axes=axes, keepdims=True)
    zeros = e.sum(e("cast", is_zero, dtype="int64"), axes, keepdims=True)
    at_the_zero = e("where", e("eq", zeros, e.const(1, "int64")), nonzero_prod, zero)
    others = e("where", e("eq", zeros, e.const(0, "int64")),
               e("div", nonzero_prod, e("where", is_zero, one, x)),
               e("where", is_zero, at_the_zero, zero))
    return e("mul", gk, others)


def _softmax_vjp(e, node, inputs, g):
    """softmax: y (g - sum(g y)); log_softmax: g - softmax(x) sum(g), along the axis."""
    axis = node.attr("axis")
    if node.op == "softmax":
        inner = e.sum(e("mul", g, node), (axis,), keepdims=True)
        return (e("mul", node, e("sub", g, inner)),)
    total = e.sum(g, (axis,), keepdims=True)
    return (e("sub", g, e("mul", e("exp", node), total)),)


def specs() -> list[OpSpec]:
    out = [OpSpec(name, REDUCE, None, _infer_reduce, attrs=("axes", "keepdims"),
                  compiler_attrs=("prologue",),
                  required_attrs=("axes",), doc=f"{name} over axes", vjp=_reduce_vjp)
           for name in REDUCTIONS]
    for name in ("softmax", "log_softmax"):
        out.append(OpSpec(name, AXIS_WHOLE, 1, _infer_softmax, flops_per_element=15,
                          temp_bytes_per_element=8, attrs=("axis",), required_attrs=("axis",),
                          doc=f"{name} along one axis (kept whole in each chunk)",
                          vjp=_softmax_vjp))
    return out
