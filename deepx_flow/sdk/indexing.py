"""`tensor[...]`: basic indexing with slices, integers, `...` and `None`.

A subscript becomes one `slice` node (positive steps; negative bounds counted from the end)
followed, when integers drop axes or None adds them, by a `reshape`.
"""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.sdk.tensor import Tensor, apply


def getitem(x: Tensor, index) -> Tensor:
    if not isinstance(index, tuple):
        index = (index,)
    if sum(i is Ellipsis for i in index) > 1:
        raise GraphError("an index can hold only one '...'", x.node.id)
    used = sum(1 for i in index if i is not None and i is not Ellipsis)
    if used > x.ndim:
        raise GraphError(f"too many indices ({used}) for a {x.ndim}-D tensor", x.node.id)
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (x.ndim - used) + index[at + 1:]
    else:
        index = index + (slice(None),) * (x.ndim - used)
    starts, stops, steps, out_shape = [], [], [], []
    axis = 0
    for item in index:
        if item is None:
            out_shape.append(1)
            continue
        dim = x.shape[axis]
        if isinstance(item, slice):
            lo, hi, step = item.indices(dim)
            if step < 1:
                raise GraphError(f"axis {axis}: negative or zero slice steps are not supported",
                                 x.node.id)
            hi = max(lo, hi)
            out_shape.append(-(-(hi - lo) // step))
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -dim <= item < dim:
                raise GraphError(f"index {item} is out of range for axis {axis} of size {dim}",
                                 x.node.id)
            lo, hi, step = item % dim, item % dim + 1, 1
        else:
            raise GraphError(f"unsupported index {shown(item)}: use ints, slices, ... and None",
                             x.node.id)
        starts.append(lo), stops.append(hi), steps.append(step)
        axis += 1
    out = x
    if (tuple(starts), tuple(stops), tuple(steps)) != ((0,) * x.ndim, x.shape, (1,) * x.ndim):
        out = apply("slice", [x], starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    if tuple(out_shape) != out.shape:
        out = apply("reshape", [out], shape=tuple(out_shape))
    return out
