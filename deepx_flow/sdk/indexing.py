"""`tensor[...]`: basic indexing with slices, integers, `...` and `None`.

A subscript becomes one `slice` node (negative bounds counted from the end), a `flip` of
the axes it steps through backwards (`x[::-1]`, `x[8:2:-3]`: the same elements taken with a
positive step, then reversed), and, when integers drop axes or None adds them, a `reshape`.
Everything else NumPy calls advanced indexing (boolean masks, integer arrays or lists,
tensors) has no operator here and is refused by name, as are slice bounds that are not
integers and a zero step.
"""

from __future__ import annotations

import operator

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ops.common import is_integer
from deepx_flow.sdk.tensor import Tensor, apply


def getitem(x: Tensor, index) -> Tensor:
    if not isinstance(index, tuple):
        index = (index,)
    for item in index:
        _check_item(x, item)
    # Identity tests only: `in` and `.index` would compare items with ==, which a Tensor or
    # an array answers elementwise.
    ellipses = [i for i, item in enumerate(index) if item is Ellipsis]
    if len(ellipses) > 1:
        raise GraphError("an index can hold only one '...'", x.node.id)
    used = sum(1 for i in index if i is not None and i is not Ellipsis)
    if used > x.ndim:
        raise GraphError(f"too many indices ({used}) for a {x.ndim}-D tensor", x.node.id)
    if ellipses:
        at = ellipses[0]
        index = index[:at] + (slice(None),) * (x.ndim - used) + index[at + 1:]
    else:
        index = index + (slice(None),) * (x.ndim - used)
    starts, stops, steps, out_shape, backwards = [], [], [], [], []
    axis = 0
    for item in index:
        if item is None:
            out_shape.append(1)
            continue
        dim = x.shape[axis]
        if isinstance(item, slice):
            lo, hi, step = item.indices(dim)
            count = len(range(lo, hi, step))
            if step < 0:  # the same elements with a positive step, reversed afterwards
                lo, hi, step = (lo + (count - 1) * step, lo + 1, -step) if count else (0, 0, 1)
                if count > 1:
                    backwards.append(len(starts))
            if count <= 1:  # the step moves past the end at once (x[::2**70]): unit steps
                hi, step = lo + count, 1
            out_shape.append(count)
        else:
            item = operator.index(item)
            if not -dim <= item < dim:
                raise GraphError(f"index {item} is out of range for axis {axis} of size {dim}",
                                 x.node.id)
            lo, hi, step = item % dim, item % dim + 1, 1
        starts.append(lo), stops.append(hi), steps.append(step)
        axis += 1
    out = x
    if (tuple(starts), tuple(stops), tuple(steps)) != ((0,) * x.ndim, x.shape, (1,) * x.ndim):
        out = apply("slice", [x], starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    if backwards:
        out = apply("flip", [out], axes=tuple(backwards))
    if tuple(out_shape) != out.shape:
        out = apply("reshape", [out], shape=tuple(out_shape))
    return out


def _check_item(x: Tensor, item) -> None:
    """Refuse what basic indexing cannot take, before anything compares or converts it."""
    if item is None or item is Ellipsis or is_integer(item):
        return
    if isinstance(item, slice):
        for part in (item.start, item.stop, item.step):
            if part is not None and not is_integer(part):
                raise GraphError(f"slice bounds must be integers or None, got {shown(item)}",
                                 x.node.id)
        if item.step is not None and item.step == 0:
            raise GraphError(f"slice step cannot be zero, got {shown(item)}", x.node.id)
        return
    if isinstance(item, (Tensor, np.ndarray, list)):
        what = "a tensor" if isinstance(item, Tensor) else f"a {type(item).__name__}"
        raise GraphError(f"indexing with {what} (a boolean mask or integer array) is not "
                         "supported; use ints, slices, ... and None, or dx.where to choose "
                         "elements", x.node.id)
    raise GraphError(f"unsupported index {shown(item)}: use ints, slices, ... and None",
                     x.node.id)
