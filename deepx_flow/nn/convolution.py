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
from deepx_flow.sdk import functions as F
from deepx_flow.sdk.tensor import Tensor, apply, as_tensor


def _per_axis(name: str, value, spatial: int) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * spatial
    value = tuple(value) if isinstance(value, (tuple, list)) else None
    if value is None or len(value) != spatial:
        raise GraphError(f"{name} must be an int or {spatial} ints (one per spatial axis)")
    return value


def _pads(padding, spatial: int) -> tuple[int, ...]:
    if isinstance(padding, (tuple, list)) and len(padding) == 2 * spatial and spatial > 0:
        return tuple(padding)
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
    if b is not None:
        b = as_tensor(b)
        if b.shape != (w.shape[0],):
            raise GraphError(f"conv: the bias must be ({w.shape[0]},), one per filter, got "
                             f"{shown(b.shape)}")
        y = y + F.reshape(b, (w.shape[0],) + (1,) * n)
    return y


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
