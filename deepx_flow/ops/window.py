"""Sliding-window operators on NC... tensors: convolution and max/average pooling.

Layout: `x` is (N, C, *spatial) with 1, 2 or 3 spatial axes (NCHW for images); `conv`'s
weights `w` are (M, C / groups, *kernel). Attributes, one value per spatial axis:

- `strides` (default 1), `dilations` (default 1), and `pads` (default 0): the zeros added
  before and after each spatial axis, ONNX's order (begins, then ends);
- `conv`: `groups` (default 1): C and M are split into that many groups, group g's outputs
  reading only group g's inputs (groups = C is a depthwise convolution);
- pooling: `kernel` (the window's shape); `max_pool` (floats and integers) skips padding
  (it is the dtype's lowest value), `avg_pool` (floats)
  divides by the window's size without padding (`count_include_pad` 0, ONNX's default) or
  with it (1).

Output size along a spatial axis: floor((size + pad_begin + pad_end - dilation (k - 1) - 1)
/ stride) + 1, at least 1. The computation is a cross-correlation (the kernel is not flipped),
as in every deep-learning framework and ONNX.

Chunking (`WINDOW` kind): along the batch axis N and the spatial axes; the channels are
whole, and so are the weights. A task of a block of output positions reads the input
positions their windows cover (`input_window`): its own and a halo of the neighbouring
chunks' (assembled from their chunks by the lowering), with the padding it adds where its
windows pass the image's edge. So an image larger than a task's memory is computed in
spatial pieces. The CPU kernel is im2col and one BLAS GEMM per group (`kernels/window.py`).

Gradients (`ops/window_grad.py`): conv's input gradient is a transposed convolution, its
weight gradient a matmul per kernel offset contracting the batch and output positions;
avg_pool spreads the cotangent over each window's count; max_pool routes it to the first
position in window order that holds the maximum (or the first NaN).
"""

from __future__ import annotations

import math

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.spec import WINDOW, OpSpec
from deepx_flow.ops.window_attrs import spatial_attrs
from deepx_flow.ops.window_grad import avg_pool_vjp, conv_vjp, max_pool_vjp

POOLS = ("max_pool", "avg_pool")


def out_size(size: int, k: int, stride: int, pad: tuple[int, int], dilation: int) -> int:
    return (size + pad[0] + pad[1] - dilation * (k - 1) - 1) // stride + 1


def input_window(out: tuple[int, int], size: int, k: int, stride: int, pad_begin: int,
                 dilation: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The input positions output positions `out` (start, stop) of a spatial axis read,
    and the padding the task adds around them: ((start, stop), (pad before, pad after)).
    The window of the output's first position starts at `start * stride - pad_begin`; the
    last one's ends `dilation (k - 1)` past its own start. Positions outside 0..size are
    padding (the image's edge); those inside are the image's, a neighbour chunk's among them
    (the halo). The task's output size with that padding is stop - start."""
    first = out[0] * stride - pad_begin
    end = (out[1] - 1) * stride - pad_begin + dilation * (k - 1) + 1
    lo = min(max(first, 0), size)
    hi = min(max(end, lo), size)
    # (windows wholly in the padding, a conv's with pads wider than its kernel, read nothing)
    return (lo, hi), (max(0, min(lo, end) - first), max(0, end - max(hi, first)))


def _spatial_out(node, x_shape, kernel, strides, pads, dilations) -> tuple[int, ...]:
    n = len(kernel)
    out = []
    for a in range(n):
        o = out_size(x_shape[2 + a], kernel[a], strides[a], (pads[a], pads[n + a]), dilations[a])
        if o < 1:
            raise GraphError(f"{node.op}: the window ({kernel[a]} wide, dilation "
                             f"{dilations[a]}) does not fit spatial axis {a} of size "
                             f"{x_shape[2 + a]} with pads {pads[a]}, {pads[n + a]}", node.id)
        out.append(o)
    return tuple(out)


def _check_x(node, x) -> int:
    if not 3 <= x.ndim <= 5:
        raise GraphError(f"{node.op} takes (N, C, *spatial) with 1 to 3 spatial axes, got "
                         f"shape {x.shape}", node.id)
    if not dtypes.is_float(x.dtype) and not (node.op == "max_pool" and x.dtype != "bool"):
        raise GraphError(f"{node.op} is defined for floats, got {x.dtype}", node.id)
    return x.ndim - 2


def _infer_conv(node, inputs):
    x, w = inputs
    spatial = _check_x(node, x)
    if w.ndim != x.ndim:
        raise GraphError(f"conv: weights must be (M, C / groups, *kernel) with {spatial} kernel "
                         f"axes, got shape {w.shape} for input {x.shape}", node.id)
    if w.dtype != x.dtype:
        raise GraphError(f"conv: input and weights must have one dtype, got {x.dtype} and "
                         f"{w.dtype}", node.id)
    groups = node.attr("groups", 1)
    if not isinstance(groups, int) or groups < 1 or x.shape[1] % groups or w.shape[0] % groups:
        raise GraphError(f"conv: groups {shown(groups)} must divide the input's {x.shape[1]} "
                         f"channels and the {w.shape[0]} filters", node.id)
    if w.shape[1] * groups != x.shape[1]:
        raise GraphError(f"conv: weights {w.shape} read {w.shape[1]} channels per group, but "
                         f"the input has {x.shape[1]} channels in {groups} group(s)", node.id)
    strides, pads, dilations = spatial_attrs(node, spatial)
    out = _spatial_out(node, x.shape, w.shape[2:], strides, pads, dilations)
    return (x.shape[0], w.shape[0]) + out, x.dtype


def _infer_pool(node, inputs):
    (x,) = inputs
    spatial = _check_x(node, x)
    kernel = node.attr("kernel")
    if not isinstance(kernel, (tuple, list)) or len(kernel) != spatial or not all(
            isinstance(k, int) and k >= 1 for k in kernel):
        raise GraphError(f"{node.op}: kernel must be {spatial} positive integers, got "
                         f"{shown(kernel)}", node.id)
    strides, pads, dilations = spatial_attrs(node, spatial)
    n = spatial
    out = _spatial_out(node, x.shape, tuple(kernel), strides, pads, dilations)
    for a in range(n):
        # every window must hold an element of the input: a maximum or mean of padding only
        # has no value (checked per position: dilated taps can step over the data)
        size = x.shape[2 + a]
        for o in range(out[a]):
            first = o * strides[a] - pads[a]
            if not any(0 <= first + k * dilations[a] < size for k in range(kernel[a])):
                raise GraphError(f"{node.op}: output position {o} of spatial axis {a} would "
                                 f"be a window of padding only (pads {pads[a]}, {pads[n + a]}, "
                                 f"kernel {kernel[a]}, dilation {dilations[a]}, size {size})",
                                 node.id)
    if node.attr("count_include_pad", 0) not in (0, 1):
        raise GraphError("avg_pool: count_include_pad is 0 or 1", node.id)
    return x.shape[:2] + out, x.dtype


def conv_flops(node, inputs) -> float:
    """Multiply-adds x 2 per output element: C / groups x the kernel's size."""
    w = inputs[1]
    return 2.0 * math.prod(w.shape[1:])


def specs() -> list[OpSpec]:
    attrs = ("strides", "pads", "dilations")
    return [
        OpSpec("conv", WINDOW, 2, _infer_conv, attrs=attrs + ("groups",),
               doc="N-D convolution (cross-correlation), NC... layout, with strides, pads, "
                   "dilations and groups", vjp=conv_vjp),
        OpSpec("max_pool", WINDOW, 1, _infer_pool, attrs=attrs + ("kernel",),
               required_attrs=("kernel",), doc="the largest value of each window (NaN "
                                               "propagates); padding is skipped",
               vjp=max_pool_vjp),
        OpSpec("avg_pool", WINDOW, 1, _infer_pool, attrs=attrs + ("kernel", "count_include_pad"),
               required_attrs=("kernel",), doc="the mean of each window, padding not counted "
                                               "unless count_include_pad",
               vjp=avg_pool_vjp),
    ]
