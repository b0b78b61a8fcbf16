"""Gradient rules of the window operators (`conv`, `max_pool`, `avg_pool`), and the
transposed convolution that they and `dx.nn.conv_transpose` are built on.

The rules build ordinary nodes from existing operators, so a CNN's backward pass is fused,
chunked along the batch axis and run like its forward pass:

- `conv`, input: the transposed convolution of the cotangent with the weights
  (`conv_transpose`): the cotangent spread out by the stride (stride - 1 zeros between its
  elements), padded by dilation (k - 1) less the forward pads, and convolved at stride 1
  with the kernel flipped and its two channel axes swapped group by group. Input positions
  no window reads (past the last window when the stride leaves a remainder) get zeros.
- `conv`, weights: for each kernel offset, the strided slice of the padded input that the
  offset's taps read, times the cotangent, summed over the images and output positions:
  one matmul per offset, (groups, M / groups, N P) @ (groups, N P, C / groups) with P the
  output positions per image. Its contraction axis N P is chunked and tree-summed like any
  matmul's; the batch axis leads it, so chunks hold whole images.
- `avg_pool`: the cotangent divided by each window's count (the kernel's size, or the
  number of its taps on the data when `count_include_pad` is 0), spread back over the
  window (overlapping windows add up, padding is dropped): a transposed convolution with a
  kernel of ones, the images and channels folded into the batch axis.
- `max_pool`: each window's cotangent goes to one position: the first, in window order
  (kernel offsets in row-major order, the first spatial axis slowest), that holds the
  window's maximum, or the first NaN when the maximum is NaN (NaN propagates in the forward
  pass). A tied maximum later in the window gets nothing, so each window's gradient sums to
  its cotangent, as in PyTorch and JAX; padding never gets it. The choice is the index of
  that offset per output position; the cotangent is put at that offset's channel of a
  (N C, kernel size, *out) tensor and spread back by a transposed convolution whose kernel
  is one-hot per channel.
- Pools whose windows do not overlap and have adjacent taps (stride >= kernel, no
  dilation: the usual 2 x 2 pool of stride 2) skip the transposed convolution: the
  per-tap shares are laid out at their input positions by reshapes, a transpose and zero
  padding (`_tile_windows`), with no arithmetic.

`conv_transpose` is written against the emitter's interface (`compiler.emit.Emitter`):
`b(op, *inputs, **attrs)` builds a typed node and `b.zeros(shape, dtype)` a zero tensor;
the SDK passes a builder of Tensors with the same two methods (`nn.convolution`).
"""

from __future__ import annotations

import itertools
import math

from deepx_flow.ir import dtypes
from deepx_flow.ops.window_attrs import spatial_attrs


def conv_transpose(b, x, w, strides, pads, dilations, groups: int, output_padding):
    """The transposed convolution of `x` (N, C, *spatial) with `w` (C, M / groups, *kernel),
    without bias: each input element adds the kernel, scaled by it, at its position times
    the stride. Output size per spatial axis: `stride (size - 1) + output_padding +
    dilation (k - 1) + 1 - pad_begin - pad_end`. `b` builds the nodes (see the module
    docstring); the arguments are checked by the `conv` node it ends with."""
    n = x.ndim - 2
    kernel = tuple(w.shape[2:])
    for a in range(n):
        if strides[a] > 1 and x.shape[2 + a] > 1:
            x = _spread(b, x, 2 + a, strides[a])
    widths, starts, stops = [(0, 0), (0, 0)], [0, 0], list(x.shape[:2])
    for a in range(n):
        full_pad = dilations[a] * (kernel[a] - 1)
        begin = full_pad - pads[a]
        end = full_pad - pads[n + a] + output_padding[a]
        widths.append((max(begin, 0), max(end, 0)))
        starts.append(max(-begin, 0))
        stops.append(x.shape[2 + a] - max(-end, 0))
    if any(starts) or tuple(stops) != x.shape:
        x = b("slice", x, starts=tuple(starts), stops=tuple(stops), steps=(1,) * x.ndim)
    # the zeros around it are the conv's own padding: no block of them the batch's size
    pads = tuple(before for before, _ in widths[2:]) + tuple(after for _, after in widths[2:])
    return b("conv", x, _transposed_filters(b, w, groups), strides=(1,) * n,
             pads=pads, dilations=tuple(dilations), groups=groups)


def pad(b, x, widths, value=0):
    """`x` with `widths[axis]` = (before, after) elements of `value` around each axis."""
    for axis, (before, after) in enumerate(widths):
        parts = [b("full", shape=x.shape[:axis] + (width,) + x.shape[axis + 1:],
                   dtype=x.dtype, value=value) if width else None for width in (before, after)]
        if parts[0] is not None or parts[1] is not None:
            x = b("concat", *[p for p in (parts[0], x, parts[1]) if p is not None], axis=axis)
    return x


def _spread(b, x, axis: int, step: int):
    """`x` with step - 1 zeros between its elements along `axis`: each element takes the
    first of `step` places along a new axis (a `where` of a mask of that axis), so no block
    of zeros has the batch's size (a model exported with a dynamic batch holds none)."""
    size = x.shape[axis]
    cell = b("reshape", x, shape=x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
    places = b("arange", shape=(step,), dtype="int64", start=0, step=1)
    first = b("eq", places, b("full", shape=(), dtype="int64", value=0))
    mask = b("reshape", first, shape=(1,) * (axis + 1) + (step,) + (1,) * (x.ndim - axis - 1))
    woven = b("reshape", b("where", mask, cell, b("full", shape=(), dtype=x.dtype, value=0)),
              shape=x.shape[:axis] + (size * step,) + x.shape[axis + 1:])
    stops = tuple((size - 1) * step + 1 if i == axis else s for i, s in enumerate(woven.shape))
    return b("slice", woven, starts=(0,) * x.ndim, stops=stops, steps=(1,) * x.ndim)


def _transposed_filters(b, w, groups: int):
    """`w` (C, M / groups, *kernel) as the filters (M, C / groups, *kernel) of the
    convolution a transposed convolution is: the kernel flipped along each spatial axis and
    the channel axes swapped within each group."""
    for a, k in enumerate(w.shape[2:]):
        if k > 1:
            backwards = b("arange", shape=(k,), dtype="int64", start=k - 1, step=-1)
            w = b("take", w, backwards, axis=2 + a)
    rest = tuple(range(2, w.ndim))
    if groups == 1:
        return b("transpose", w, axes=(1, 0) + rest)
    c, mg = w.shape[:2]
    split = b("reshape", w, shape=(groups, c // groups, mg) + w.shape[2:])
    swapped = b("transpose", split, axes=(0, 2, 1) + tuple(a + 1 for a in rest))
    return b("reshape", swapped, shape=(groups * mg, c // groups) + w.shape[2:])


def _leftover(x, out, kernel, strides, pads, dilations) -> tuple[int, ...]:
    """Per spatial axis, the input positions past the last window's reach: the transposed
    convolution's output padding that gives back the input's size."""
    n = x.ndim - 2
    return tuple(x.shape[2 + a] + pads[a] + pads[n + a]
                 - (strides[a] * (out[a] - 1) + dilations[a] * (kernel[a] - 1) + 1)
                 for a in range(n))


def _pool_window(node, x):
    """(kernel, strides, pads, dilations, leftover) of a pooling node over input `x`."""
    strides, pads, dilations = spatial_attrs(node, x.ndim - 2)
    kernel = tuple(node.attr("kernel"))
    return kernel, strides, pads, dilations, _leftover(x, node.shape[2:], kernel, strides,
                                                       pads, dilations)


# -- conv -------------------------------------------------------------------------------
def conv_vjp(e, node, inputs, g):
    """dx: the transposed convolution of `g` with `w`; dw: one matmul per kernel offset
    (see the module docstring)."""
    x, w = inputs
    n = x.ndim - 2
    kernel = tuple(w.shape[2:])
    strides, pads, dilations = spatial_attrs(node, n)
    groups = node.attr("groups", 1)
    leftover = _leftover(x, node.shape[2:], kernel, strides, pads, dilations)
    dx = conv_transpose(e, g, w, strides, pads, dilations, groups, leftover)
    return dx, _conv_weight_grad(e, x, g, kernel, strides, pads, dilations, groups)


def _conv_weight_grad(e, x, g, kernel, strides, pads, dilations, groups):
    images, c = x.shape[:2]
    n, m = x.ndim - 2, g.shape[1]
    out = g.shape[2:]
    rows = images * math.prod(out)
    cg, mg = c // groups, m // groups
    last = (0,) + tuple(range(2, 2 + n)) + (1,)  # channels last: (N, *spatial, C)
    gt = e("reshape", e("transpose", g, axes=last), shape=(rows, groups, mg))
    gt = e("transpose", gt, axes=(1, 2, 0))  # (groups, M / groups, N P)
    # Pad only as far as the last window reaches (a stride's remainder is never read).
    reach = [strides[a] * (out[a] - 1) + dilations[a] * (kernel[a] - 1) + 1 for a in range(n)]
    widths = [(0, 0)] + [(pads[a], max(0, reach[a] - pads[a] - x.shape[2 + a]))
                         for a in range(n)] + [(0, 0)]
    source = pad(e, e("transpose", x, axes=last), widths)
    parts = []
    for k in itertools.product(*(range(s) for s in kernel)):
        first = tuple(k[a] * dilations[a] for a in range(n))
        taps = e("slice", source, starts=(0,) + first + (0,),
                 stops=(images,) + tuple(first[a] + strides[a] * (out[a] - 1) + 1
                                         for a in range(n)) + (c,),
                 steps=(1,) + tuple(strides) + (1,))  # (N, *out, C)
        taps = e("transpose", e("reshape", taps, shape=(rows, groups, cg)), axes=(1, 0, 2))
        parts.append(e("reshape", e("matmul", gt, taps), shape=(m, cg, 1)))
    dw = parts[0] if len(parts) == 1 else e("concat", *parts, axis=2)
    return e("reshape", dw, shape=(m, cg) + kernel)


# -- pools ------------------------------------------------------------------------------
def avg_pool_vjp(e, node, inputs, g):
    """The cotangent over each window's count, spread back over the window."""
    (x,) = inputs
    kernel, strides, pads, dilations, leftover = _pool_window(node, x)
    # float16 divides in float32: a count past 2,048 has no exact float16
    work = "float32" if g.dtype == "float16" else g.dtype
    share = g if work == g.dtype else e("cast", g, dtype=work)
    if node.attr("count_include_pad", 0) or not any(pads):
        share = e("div", share, e.const(math.prod(kernel), work))
    else:  # the taps on the data: the same windows summed over ones
        ones = e("full", shape=(1, 1) + x.shape[2:], dtype=work, value=1)
        counts = e("conv", ones, e("full", shape=(1, 1) + kernel, dtype=work, value=1),
                   strides=strides, pads=pads, dilations=dilations, groups=1)
        share = e("div", share, counts)
    if work != g.dtype:
        share = e("cast", share, dtype=g.dtype)
    folded = e("reshape", share, shape=(x.shape[0] * x.shape[1], 1) + g.shape[2:])
    if _disjoint(kernel, strides, dilations):
        every = e.broadcast_to(folded, folded.shape[:1] + (math.prod(kernel),) + g.shape[2:])
        return (_tile_windows(e, every, x.shape, kernel, strides, pads),)
    ones = e("full", shape=(1, 1) + kernel, dtype=g.dtype, value=1)
    spread = conv_transpose(e, folded, ones, strides, pads, dilations, 1, leftover)
    return (e("reshape", spread, shape=x.shape),)


def max_pool_vjp(e, node, inputs, g):
    """The cotangent to the first position of each window holding its maximum (or its first
    NaN); see the module docstring."""
    (x,) = inputs
    if not dtypes.is_float(x.dtype):
        return (None,)
    kernel, strides, pads, dilations, leftover = _pool_window(node, x)
    n, out = x.ndim - 2, node.shape[2:]
    count = math.prod(kernel)
    widths = [(0, 0), (0, 0)] + [(pads[a], pads[n + a]) for a in range(n)]
    source = pad(e, x, widths)  # the padding's value is masked out below
    on_data = pad(e, e("full", shape=(1, 1) + x.shape[2:], dtype="bool", value=True), widths,
                  value=False) if any(pads) else None
    yes, no = e.const(True, "bool"), e.const(False, "bool")
    first = None  # per output position, the offset that gets the cotangent
    offsets = list(itertools.product(*(range(s) for s in kernel)))
    for index in reversed(range(count)):  # the outermost `where` is the first offset
        k = offsets[index]
        starts = (0, 0) + tuple(k[a] * dilations[a] for a in range(n))
        stops = x.shape[:2] + tuple(starts[2 + a] + strides[a] * (out[a] - 1) + 1
                                    for a in range(n))
        steps = (1, 1) + tuple(strides)
        taps = e("slice", source, starts=starts, stops=stops, steps=steps)
        hit = e("where", e("eq", taps, node), yes, e("ne", taps, taps))  # the max, or a NaN
        if on_data is not None:
            hit = e("where", e("slice", on_data, starts=(0, 0) + starts[2:],
                               stops=(1, 1) + stops[2:], steps=steps), hit, no)
        first = e("where", hit, e.const(index, "int32"),
                  first if first is not None else e.const(count, "int32"))
    folded = (x.shape[0] * x.shape[1], 1) + out
    slots = e("reshape", e("arange", shape=(count,), dtype="int32", start=0, step=1),
              shape=(1, count) + (1,) * n)
    stacked = e("where", e("eq", e("reshape", first, shape=folded), slots),
                e("reshape", g, shape=folded), e.const(0, g.dtype))  # (N C, count, *out)
    if _disjoint(kernel, strides, dilations):
        return (_tile_windows(e, stacked, x.shape, kernel, strides, pads),)
    one_hot = e("cast", e("eq", e("reshape", slots, shape=(count, 1)),
                          e("reshape", slots, shape=(1, count))), dtype=g.dtype)
    one_hot = e("reshape", one_hot, shape=(count, 1) + kernel)
    spread = conv_transpose(e, stacked, one_hot, strides, pads, dilations, 1, leftover)
    return (e("reshape", spread, shape=x.shape),)


def _disjoint(kernel, strides, dilations) -> bool:
    """Whether no two windows share an input position and each window's taps are adjacent
    (the usual 2 x 2 pool of stride 2): its gradient is then a rearrangement."""
    return all(s >= k and (d == 1 or k == 1) for k, s, d in zip(kernel, strides, dilations))


def _tile_windows(e, shares, x_shape, kernel, strides, pads):
    """The (N C, taps, *out) shares of disjoint windows' taps laid out at their input
    positions, zeros elsewhere: each window's taps in a cell of `stride` positions per axis,
    the cells side by side, then the padding cut off and the positions past the last window
    filled with zeros. Layout operators only, no arithmetic."""
    n, rows = len(kernel), shares.shape[0]
    out = shares.shape[2:]
    cells = e("reshape", shares, shape=(rows,) + tuple(kernel) + out)
    cells = pad(e, cells, [(0, 0)] + [(0, strides[a] - kernel[a]) for a in range(n)]
                + [(0, 0)] * n)
    order = (0,) + tuple(axis for a in range(n) for axis in (1 + n + a, 1 + a))
    laid = e("reshape", e("transpose", cells, axes=order),
             shape=(rows,) + tuple(out[a] * strides[a] for a in range(n)))
    stops = (rows,) + tuple(min(laid.shape[1 + a], pads[a] + x_shape[2 + a]) for a in range(n))
    if stops != laid.shape or any(pads[:n]):
        laid = e("slice", laid, starts=(0,) + tuple(pads[:n]), stops=stops,
                 steps=(1,) * (n + 1))
    laid = pad(e, laid, [(0, 0)] + [(0, x_shape[2 + a] - laid.shape[1 + a]) for a in range(n)])
    return e("reshape", laid, shape=x_shape)
