"""Convolution and pooling on NC... tensors (images are NCHW), as graph nodes.

    y = dx.nn.conv(x, w, b, stride=2, padding=1)        # x (N, C, H, W), w (M, C, kH, kW)
    y = dx.nn.max_pool(y, kernel=2)                     # stride defaults to the kernel
    y = dx.nn.global_avg_pool(y)                        # (N, M, 1, 1)

Each spatial setting is an int (the same on every spatial axis) or one value per axis;
`padding` may also be 2 values per axis, ONNX's order (all begins, then all ends). These
build the `conv`, `max_pool` and `avg_pool` operators (`deepx_flow.ops.window`), which the
compiler chunks along the batch axis.
"""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.ops.common import is_integer
from deepx_flow.ops.window_grad import conv_transpose as transposed_conv
from deepx_flow.sdk import functions as F
from deepx_flow.sdk.tensor import Tensor, apply, as_tensor


def _per_axis(name: str, value, spatial: int) -> tuple[int, ...]:
    """An int for every spatial axis, or one per axis (their ranges are the operator's to
    check)."""
    if is_integer(value):
        return (int(value),) * spatial
    if not isinstance(value, (tuple, list)) or len(value) != spatial \
            or not all(is_integer(v) for v in value):
        raise GraphError(f"{name} must be an int or {spatial} ints (one per spatial axis), "
                         f"got {shown(value)}")
    return tuple(int(v) for v in value)


def _pads(padding, spatial: int) -> tuple[int, ...]:
    if isinstance(padding, (tuple, list)) and len(padding) == 2 * spatial and spatial > 0 \
            and all(is_integer(v) for v in padding):
        return tuple(int(v) for v in padding)
    per = _per_axis("padding", padding, spatial)
    return per + per


def _spatial(x: Tensor, what: str) -> int:
    if not 3 <= x.ndim <= 5:
        raise GraphError(f"{what} takes (N, C, *spatial) with 1 to 3 spatial axes, got shape "
                         f"{x.shape} (operand: {x.node.id})")
    return x.ndim - 2


def conv(x, w, b=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """The convolution (cross-correlation) of `x` (N, C, *spatial) with filters `w`
    (M, C / groups, *kernel), plus the bias `b` (M,) if given."""
    x, w = as_tensor(x), as_tensor(w)
    n = _spatial(x, "conv")
    y = apply("conv", [x, w], strides=_per_axis("stride", stride, n),
              pads=_pads(padding, n), dilations=_per_axis("dilation", dilation, n),
              groups=groups)
    return _biased(y, b, "conv", "filter")


def conv_transpose(x, w, b=None, stride=1, padding=0, dilation=1, groups: int = 1,
                   output_padding=0) -> Tensor:
    """The transposed convolution (the gradient of `conv` with respect to its input) of `x`
    (N, C, *spatial) with `w` (C, M / groups, *kernel): each input element adds the kernel,
    scaled by it, at its position times `stride`. Output size per spatial axis:
    `stride (size - 1) + output_padding + dilation (k - 1) + 1 - pad_begin - pad_end`.

    Built as a `conv` (stride 1) of the input spread out by `stride` (zeros between its
    elements) and padded by `dilation (k - 1)` less `padding` on each side, with the kernel
    flipped and its channel axes swapped group by group: the composition `conv`'s gradient
    rule uses (`deepx_flow.ops.window_grad.conv_transpose`)."""
    x, w = as_tensor(x), as_tensor(w)
    n = _spatial(x, "conv_transpose")
    stride, dilation = _per_axis("stride", stride, n), _per_axis("dilation", dilation, n)
    pads, extra = _pads(padding, n), _per_axis("output_padding", output_padding, n)
    # (checked here: the stride-1 conv it is built as would take a stride of 0 as 1)
    if min(stride) < 1 or min(dilation) < 1 or min(pads) < 0 or min(extra) < 0 or \
            not is_integer(groups) or groups < 1:
        raise GraphError(f"conv_transpose: strides, dilations and groups must be positive and "
                         f"paddings non-negative, got stride {stride}, dilation {dilation}, "
                         f"padding {pads}, output_padding {extra}, groups {shown(groups)}")
    if w.ndim != x.ndim or w.shape[0] != x.shape[1] or x.shape[1] % groups:
        raise GraphError(f"conv_transpose: weights must be (C, M / groups, *kernel) for input "
                         f"{x.shape} and {groups} group(s), got {w.shape}")
    y = transposed_conv(_TensorBuilder(), x, w, stride, pads, dilation, groups, extra)
    return _biased(y, b, "conv_transpose", "output channel")


def _biased(y, b, op: str, per: str) -> Tensor:
    """`y` (N, M, *spatial) plus the bias `b` (M,) along its channels, if given."""
    if b is None:
        return y
    b = as_tensor(b)
    if b.shape != (y.shape[1],):
        raise GraphError(f"{op}: the bias must be ({y.shape[1]},), one per {per}, got "
                         f"{shown(b.shape)}")
    return y + F.reshape(b, (y.shape[1],) + (1,) * (y.ndim - 2))


class _TensorBuilder:
    """The node builder's interface (`compiler.emit.Emitter`) over SDK tensors, so that
    compositions written once for gradient rules build user graphs too."""

    def __call__(self, op: str, *inputs: Tensor, shape=None, dtype=None, **attrs) -> Tensor:
        return apply(op, list(inputs), shape=shape, dtype=dtype, **attrs)

    def zeros(self, shape, dtype: str) -> Tensor:
        return self("full", shape=tuple(shape), dtype=dtype, value=0)


def _pool(op, x, kernel, stride, padding, dilation, **extra) -> Tensor:
    x = as_tensor(x)
    n = _spatial(x, op)
    kernel = _per_axis("kernel", kernel, n)
    stride = kernel if stride is None else _per_axis("stride", stride, n)
    return apply(op, [x], kernel=kernel, strides=stride, pads=_pads(padding, n),
                 dilations=_per_axis("dilation", dilation, n), **extra)


def max_pool(x, kernel, stride=None, padding=0, dilation=1) -> Tensor:
    """The largest value of each window (stride defaults to the kernel); padding never wins,
    a NaN in a window does."""
    return _pool("max_pool", x, kernel, stride, padding, dilation)


def avg_pool(x, kernel, stride=None, padding=0, count_include_pad: bool = False) -> Tensor:
    """The mean of each window; padding is not counted unless `count_include_pad`."""
    return _pool("avg_pool", x, kernel, stride, padding, 1,
                 count_include_pad=int(bool(count_include_pad)))


def global_avg_pool(x) -> Tensor:
    """The mean over all spatial axes, kept as size 1: (N, C, 1, ...)."""
    x = as_tensor(x)
    return F.mean(x, axis=tuple(range(2, 2 + _spatial(x, "global_avg_pool"))), keepdims=True)


def global_max_pool(x) -> Tensor:
    """The largest value over all spatial axes, kept as size 1: (N, C, 1, ...)."""
    x = as_tensor(x)
    return F.max(x, axis=tuple(range(2, 2 + _spatial(x, "global_max_pool"))), keepdims=True)
