"""Helpers the operator type rules share: shapes and their bounds, broadcasting, axis checks,
declared shapes and dtypes, and whether a value fits a dtype.

Shapes are bounded as NumPy bounds them: at most `MAX_DIMS` dimensions, and an element count
that an int64 holds (`MAX_ELEMENTS`), since chunk offsets, Dask's slicing and every kernel
index with int64. `infer_node` applies the bound to every node's result, so a spec or a
Python build cannot make a tensor the compiler would only overflow on.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node

# NumPy 2's limit (NPY_MAXDIMS).
MAX_DIMS = 64
# Elements an int64 can count and index.
MAX_ELEMENTS = 2**63 - 1


def check_bounds(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape`, or a GraphError when it has more than MAX_DIMS dimensions or elements past
    int64."""
    if len(shape) > MAX_DIMS:
        raise GraphError(f"{node.op}: a shape of {len(shape)} dimensions; tensors have at most "
                         f"{MAX_DIMS}", node.id)
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        many = f"{count:.3g}" if count < 10**300 else f"about 10**{len(str(count)) - 1}"
        raise GraphError(f"{node.op}: shape {_shape_text(shape)} has {many} elements, more "
                         "than an int64 counts (2**63 - 1); no chunked plan can index it",
                         node.id)
    return shape


def broadcast(node: Node, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """NumPy broadcasting of operand shapes, or a GraphError naming the node and shapes.

    Pure arithmetic on the shapes (NumPy's `broadcast_shapes` builds arrays, which fails
    with a misleading message for results past its size or dimension limits); the result is
    bounded like every shape.
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, extent in enumerate(shape, start=ndim - len(shape)):
            if extent != 1:
                if out[i] not in (1, extent):
                    listed = " and ".join(_shape_text(s) for s in shapes)
                    raise GraphError(f"{node.op}: shapes {listed} do not broadcast", node.id)
                out[i] = extent
    return check_bounds(node, tuple(out))


def _shape_text(shape) -> str:
    text = str(tuple(shape))
    return text if len(text) <= 80 else f"{text[:40]}...{text[-30:]} ({len(shape)} dimensions)"


def normalize_axis(node: Node, axis, ndim: int) -> int:
    """`axis` of an `ndim`-D tensor as a non-negative int; NumPy's rule: -ndim <= axis < ndim
    (so a 0-d tensor has no axis)."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise GraphError(f"{node.op}: axis must be an integer, got {shown(axis)}", node.id)
    if not -ndim <= axis < ndim:
        raise GraphError(f"{node.op}: axis {axis} is out of range for {ndim}-D input", node.id)
    return axis % ndim


def normalize_axes(node: Node, axes, ndim: int) -> tuple[int, ...]:
    """Axes as a sorted tuple of non-negative ints; None means all axes."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int) and not isinstance(axes, bool):
        axes = (axes,)
    if not isinstance(axes, (tuple, list)):
        raise GraphError(f"{node.op}: axes must be an integer or a list of integers, got "
                         f"{shown(axes)}", node.id)
    out = tuple(sorted(normalize_axis(node, a, ndim) for a in axes))
    if len(set(out)) != len(out):
        raise GraphError(f"{node.op}: repeated axis in {shown(axes)}", node.id)
    return out


def check_shape(node: Node, shape, what: str = "shape") -> tuple[int, ...]:
    if shape is None:
        raise GraphError(f"{node.op} needs a declared {what}", node.id)
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise GraphError(f"{what} must be a list of non-negative integers, got {shown(shape)}",
                         node.id)
    return check_bounds(node, tuple(shape))


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


def is_integer(value) -> bool:
    """A Python or NumPy integer, not a bool (the SDK's test for shapes and indices)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def flag(value, what: str) -> bool:
    """`value` as a bool when it is True or False (NumPy's included); a GraphError naming
    `what` otherwise (a truth value read from "no", an empty array or None would be a
    guess)."""
    if not isinstance(value, (bool, np.bool_)):
        raise GraphError(f"{what} must be True or False, got {shown(value)}")
    return bool(value)


def is_number(value) -> bool:
    """A Python int or float (bools are not numbers here: `std: true` is a mistake)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fits(node: Node, value, dtype: str, what: str) -> None:
    """Raise GraphError unless `value` is held by `dtype` as it is.

    NumPy would raise for an integer out of range, but silently truncate 1.5 into an int,
    turn 2 into True, or overflow 1e300 to inf in float32. Here a bool holds True, False, 0
    and 1; an integer dtype holds integral values in its range (1000 is not an int8); a
    float dtype holds any value up to its largest finite one (inf and NaN stated as such are
    kept; rounding is not overflow).
    """
    kind = np.dtype(dtype).kind
    if isinstance(value, bool):
        return
    if not is_number(value):
        raise GraphError(f"{node.op}: {what} must be a number or bool, got {shown(value)}",
                         node.id)
    if kind == "b":
        fits = value in (0, 1)
    elif kind in "iu":
        info = np.iinfo(dtype)
        fits = (isinstance(value, int) or math.isfinite(value) and value.is_integer()) \
            and info.min <= value <= info.max
    else:
        try:
            fits = not math.isfinite(value) or abs(float(value)) <= float(dtypes.finfo(dtype).max)
        except OverflowError:  # an int past float64's range
            fits = False
    if not fits:
        raise GraphError(f"{node.op}: {what} {shown(value)} does not fit in {dtype}{_range(dtype)}",
                         node.id)


def _range(dtype: str) -> str:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return " (true, false, 0 or 1)"
    if kind in "iu":
        info = np.iinfo(dtype)
        return f" (integers {info.min}..{info.max})"
    return f" (largest finite value {float(dtypes.finfo(dtype).max):.6g})"
