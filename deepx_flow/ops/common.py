"""Helpers the operator type rules share: broadcasting, axis checks, declared shapes."""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node


def broadcast(node: Node, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """NumPy broadcasting of operand shapes, or a GraphError naming the node and shapes."""
    try:
        return tuple(int(s) for s in np.broadcast_shapes(*shapes))
    except ValueError:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise GraphError(f"{node.op}: shapes {listed} do not broadcast", node.id) from None


def normalize_axis(node: Node, axis, ndim: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise GraphError(f"{node.op}: axis must be an integer, got {shown(axis)}", node.id)
    if not -ndim <= axis < max(ndim, 1):
        raise GraphError(f"{node.op}: axis {axis} is out of range for {ndim}-D input", node.id)
    return axis % max(ndim, 1)


def normalize_axes(node: Node, axes, ndim: int) -> tuple[int, ...]:
    """Axes as a sorted tuple of non-negative ints; None means all axes."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    out = tuple(sorted(normalize_axis(node, a, ndim) for a in axes))
    if len(set(out)) != len(out):
        raise GraphError(f"{node.op}: repeated axis in {axes}", node.id)
    return out


def check_shape(node: Node, shape, what: str = "shape") -> tuple[int, ...]:
    if shape is None:
        raise GraphError(f"{node.op} needs a declared {what}", node.id)
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise GraphError(f"{what} must be a list of non-negative integers, got {shown(shape)}",
                         node.id)
    return tuple(shape)


def declared_dtype(node: Node) -> str:
    if node.dtype is None:
        raise GraphError(f"{node.op} needs a declared dtype", node.id)
    return dtypes.normalize(node.dtype, node.id)


def ufunc_dtype(node: Node, ufunc, in_dtypes: list[str]) -> str:
    try:
        return dtypes.ufunc_result(ufunc, *in_dtypes)
    except TypeError:
        raise GraphError(f"{node.op} is not defined for dtype(s) {', '.join(in_dtypes)}",
                         node.id) from None
