"""Normalization layers, composed of the graph's reductions and elementwise operators.

Each subtracts a mean and divides by `sqrt(variance + eps)`, the variance being the mean
squared deviation (the biased estimate, as every framework's forward pass), then applies a
per-channel (or per-feature) `scale` and `bias`:

- `batch_norm`: with given statistics (inference: the running mean and variance), per
  channel (axis 1); `batch_norm_stats` gives a batch's own mean and variance (training);
- `layer_norm`: over the axes from `axis` to the last, scale and bias of those axes' shape;
- `instance_norm`: per image and channel, over the spatial axes;
- `group_norm`: per image, over groups of channels (and the spatial axes); scale and bias
  per channel.

Float sums and means add up in float64 inside the engine; float16 tensors are normalized in
float32 (their squared deviations would overflow above 256) and rounded back once.
"""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.sdk import functions as F
from deepx_flow.sdk.tensor import Tensor, as_tensor


def _channel(v, x: Tensor, what: str) -> Tensor:
    """A per-channel vector (C,) shaped to broadcast against (N, C, *spatial)."""
    v = as_tensor(v, x)
    if v.shape != (x.shape[1],):
        raise GraphError(f"{what} must have one value per channel, shape ({x.shape[1]},), got "
                         f"{shown(v.shape)}")
    return F.reshape(v, (x.shape[1],) + (1,) * (x.ndim - 2))


def _normalized(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over `axes`; float16 in float32 (its squared deviations
    overflow above 256), rounded back once."""
    wide = x.dtype == "float16"
    t = F.cast(x, "float32") if wide else x
    mean = F.mean(t, axis=axes, keepdims=True)
    centered = t - mean
    var = F.mean(centered * centered, axis=axes, keepdims=True)
    y = centered / F.sqrt(var + eps)
    return F.cast(y, "float16") if wide else y


def batch_norm(x, scale, bias, mean, var, eps: float = 1e-5) -> Tensor:
    """`(x - mean) / sqrt(var + eps) * scale + bias`, per channel (axis 1)."""
    x = as_tensor(x)
    if x.ndim < 2:
        raise GraphError(f"batch_norm takes (N, C, ...), got shape {x.shape}")
    return ((x - _channel(mean, x, "mean")) / F.sqrt(_channel(var, x, "var") + eps)
            * _channel(scale, x, "scale") + _channel(bias, x, "bias"))


def batch_norm_stats(x) -> tuple[Tensor, Tensor]:
    """The per-channel mean and (biased) variance of a batch (N, C, ...), each of shape (C,)."""
    x = as_tensor(x)
    axes = (0,) + tuple(range(2, x.ndim))
    t = F.cast(x, "float32") if x.dtype == "float16" else x
    mean = F.mean(t, axis=axes, keepdims=True)
    centered = t - mean
    var = F.mean(centered * centered, axis=axes)
    mean = F.reshape(mean, (x.shape[1],))
    return (F.cast(mean, x.dtype), F.cast(var, x.dtype)) if t is not x else (mean, var)


def layer_norm(x, scale=None, bias=None, axis: int = -1, eps: float = 1e-5) -> Tensor:
    """Normalized over the axes from `axis` to the last; scale and bias have those axes'
    shape (or broadcast to it)."""
    x = as_tensor(x)
    axis = F._axis("layer_norm", x, axis)
    y = _normalized(x, tuple(range(axis, x.ndim)), eps)
    if scale is not None:
        y = y * as_tensor(scale, x)
    if bias is not None:
        y = y + as_tensor(bias, x)
    return y


def instance_norm(x, scale, bias, eps: float = 1e-5) -> Tensor:
    """Normalized per image and channel over the spatial axes, then scaled per channel."""
    x = as_tensor(x)
    if x.ndim < 3:
        raise GraphError(f"instance_norm takes (N, C, *spatial), got shape {x.shape}")
    y = _normalized(x, tuple(range(2, x.ndim)), eps)
    return y * _channel(scale, x, "scale") + _channel(bias, x, "bias")


def group_norm(x, groups: int, scale, bias, eps: float = 1e-5) -> Tensor:
    """Normalized per image over each group of `C / groups` channels and the spatial axes,
    then scaled per channel."""
    x = as_tensor(x)
    if x.ndim < 2 or not isinstance(groups, int) or groups < 1 or x.shape[1] % groups:
        raise GraphError(f"group_norm: {shown(groups)} groups must divide the "
                         f"{x.shape[1] if x.ndim > 1 else '?'} channels of shape {x.shape}")
    grouped = F.reshape(x, (x.shape[0], groups, x.shape[1] // groups) + x.shape[2:])
    y = F.reshape(_normalized(grouped, tuple(range(2, grouped.ndim)), eps), x.shape)
    return y * _channel(scale, x, "scale") + _channel(bias, x, "bias")
