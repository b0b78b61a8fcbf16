"""Operators that move elements: transpose, reshape, concat, slicing and flip.

Attributes are stored normalized (full permutations, per-axis non-negative slice bounds) so
that the YAML form is explicit and the lowering needs no defaults. reshape states its
(resolved) shape on the node; a -1 in a YAML spec is resolved on reading.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.common import check_bounds, normalize_axis
from deepx_flow.ops.spec import LAYOUT, OpSpec


def _infer_transpose(node, inputs):
    (a,) = inputs
    axes = node.attr("axes")
    if not _ints(axes) or sorted(axes) != list(range(a.ndim)):
        raise GraphError(f"transpose: axes must be a permutation of 0..{a.ndim - 1}, got "
                         f"{shown(axes)}", node.id)
    return tuple(a.shape[i] for i in axes), a.dtype


def _infer_reshape(node, inputs):
    (a,) = inputs
    shape = node.shape
    if not _ints(shape) or not all(s >= -1 for s in shape):
        raise GraphError(f"reshape needs a target shape of integers (one may be -1), got "
                         f"{shown(shape)}", node.id)
    shape = list(check_bounds(node, tuple(shape)))
    if shape.count(-1) > 1:
        raise GraphError("reshape: only one dimension may be -1", node.id)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or a.size % known:
            raise GraphError(f"reshape: cannot infer -1 in {tuple(shape)} from {a.shape}",
                             node.id)
        shape[shape.index(-1)] = a.size // known
    if math.prod(shape) != a.size:
        raise GraphError(f"reshape: cannot reshape {a.shape} ({a.size} elements) into "
                         f"{tuple(shape)}", node.id)
    return tuple(shape), a.dtype


def _infer_concat(node, inputs):
    first = inputs[0]
    if first.ndim == 0:
        raise GraphError("concat needs tensors of at least 1 dimension; reshape 0-d tensors "
                         "to (1,) first", node.id)
    axis = node.attr("axis")
    if axis is None or normalize_axis(node, axis, first.ndim) != axis:
        raise GraphError(f"concat: axis must be a non-negative axis, got {shown(axis)}", node.id)
    for other in inputs[1:]:
        same = other.ndim == first.ndim and all(
            s == t for i, (s, t) in enumerate(zip(first.shape, other.shape)) if i != axis)
        if not same:
            raise GraphError(f"concat along axis {axis}: shapes {first.shape} and "
                             f"{other.shape} differ off that axis", node.id)
    dtype = first.dtype
    for other in inputs[1:]:
        if other.dtype != dtype:
            dtype = dtypes.ufunc_result(np.add, dtype, other.dtype)
    size = sum(t.shape[axis] for t in inputs)
    return first.shape[:axis] + (size,) + first.shape[axis + 1:], dtype


def _infer_slice(node, inputs):
    (a,) = inputs
    starts, stops, steps = node.attr("starts"), node.attr("stops"), node.attr("steps")
    if not all(isinstance(v, tuple) and len(v) == a.ndim for v in (starts, stops, steps)):
        raise GraphError(f"slice needs starts, stops and steps with one entry per axis of the "
                         f"{a.ndim}-D input", node.id)
    shape = []
    for axis, (lo, hi, step, dim) in enumerate(zip(starts, stops, steps, a.shape)):
        if not (_ints((lo, hi, step)) and step >= 1 and 0 <= lo <= hi <= dim):
            raise GraphError(f"slice on axis {axis}: need 0 <= start <= stop <= {dim} and "
                             f"step >= 1, got {shown(lo)}:{shown(hi)}:{shown(step)}", node.id)
        shape.append(-(-(hi - lo) // step))
    return tuple(shape), a.dtype


def _infer_flip(node, inputs):
    (a,) = inputs
    axes = node.attr("axes")
    if not _ints(axes) or list(axes) != sorted(set(axes)) or \
            any(not 0 <= ax < a.ndim for ax in axes):
        raise GraphError(f"flip: axes must be a sorted list of distinct axes of the {a.ndim}-D "
                         f"input, got {shown(axes)}", node.id)
    return a.shape, a.dtype


def _ints(values) -> bool:
    """A tuple of Python ints (no bools, no floats that happen to be whole)."""
    return isinstance(values, tuple) and all(type(v) is int for v in values)


# -- gradient rules: each moves the cotangent back to where its elements came from ---------
def _transpose_vjp(e, node, inputs, g):
    axes = node.attr("axes")
    return (e("transpose", g, axes=tuple(axes.index(i) for i in range(len(axes)))),)


def _reshape_vjp(e, node, inputs, g):
    return (e("reshape", g, shape=inputs[0].shape),)


def _concat_vjp(e, node, inputs, g):
    axis, offset, out = node.attr("axis"), 0, []
    for t in inputs:
        out.append(_take_range(e, g, axis, offset, offset + t.shape[axis]))
        offset += t.shape[axis]
    return tuple(out)


def _slice_vjp(e, node, inputs, g):
    """The cotangent put back at the sliced positions, zeros elsewhere: per axis, a step of
    s interleaves s - 1 zeros after each element, and zeros pad the rest on both sides."""
    (x,) = inputs
    if 0 in g.shape:
        return (e.zeros(x.shape, g.dtype),)
    starts, steps = node.attr("starts"), node.attr("steps")
    for axis, (start, step) in enumerate(zip(starts, steps)):
        n = g.shape[axis]
        if step > 1 and n > 1:
            spread = g.shape[:axis + 1] + (1,) + g.shape[axis + 1:]
            gaps = g.shape[:axis + 1] + (step - 1,) + g.shape[axis + 1:]
            woven = e("concat", e("reshape", g, shape=spread), e.zeros(gaps, g.dtype),
                      axis=axis + 1)
            flat = e("reshape", woven, shape=g.shape[:axis] + (n * step,) + g.shape[axis + 1:])
            g = _take_range(e, flat, axis, 0, (n - 1) * step + 1)
        before, after = start, x.shape[axis] - start - g.shape[axis]
        parts = [e.zeros(g.shape[:axis] + (w,) + g.shape[axis + 1:], g.dtype) if w else None
                 for w in (before, after)]
        if parts[0] is not None or parts[1] is not None:
            g = e("concat", *[p for p in (parts[0], g, parts[1]) if p is not None], axis=axis)
    return (g,)


def _flip_vjp(e, node, inputs, g):
    return (e("flip", g, axes=node.attr("axes")),)


def _take_range(e, x, axis: int, lo: int, hi: int):
    """`x[..., lo:hi, ...]` along `axis` (x itself for its whole extent)."""
    if (lo, hi) == (0, x.shape[axis]):
        return x
    starts = tuple(lo if a == axis else 0 for a in range(x.ndim))
    stops = tuple(hi if a == axis else s for a, s in enumerate(x.shape))
    return e("slice", x, starts=starts, stops=stops, steps=(1,) * x.ndim)


def specs() -> list[OpSpec]:
    return [
        OpSpec("transpose", LAYOUT, 1, _infer_transpose, attrs=("axes",),
               required_attrs=("axes",), doc="permute axes", vjp=_transpose_vjp),
        OpSpec("reshape", LAYOUT, 1, _infer_reshape, declared=("shape",),
               doc="same elements in row-major order, new shape", vjp=_reshape_vjp),
        OpSpec("concat", LAYOUT, None, _infer_concat, attrs=("axis",), required_attrs=("axis",),
               doc="join tensors along an axis", vjp=_concat_vjp),
        OpSpec("slice", LAYOUT, 1, _infer_slice, attrs=("starts", "stops", "steps"),
               required_attrs=("starts", "stops", "steps"), doc="start:stop:step on each axis",
               vjp=_slice_vjp),
        # A negative slice step is a slice with a positive one, then a flip (`x[::-1]`).
        OpSpec("flip", LAYOUT, 1, _infer_flip, attrs=("axes",), required_attrs=("axes",),
               doc="reverse the order of the elements along axes", vjp=_flip_vjp),
    ]
