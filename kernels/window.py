"""Sliding-window kernels: N-D convolution (im2col and a GEMM per group) and pooling.

Written against the array module of the operands (NumPy, or CuPy on a GPU), so one code
states the semantics on both (`deepx_flow.ops.window` has the operators' definitions):

- The input is padded once (zeros for `conv` and `avg_pool`; the dtype's lowest value, -inf
  for floats, for `max_pool`, so padding never wins; NaN still propagates, as in NumPy's
  maximum).
- A window view (`as_strided`, no copy) gives, for every output position, the dilated
  window under it: shape (N, C, *out, *kernel).
- `conv`: per group, the view is copied into the im2col matrix (N * out positions, C/g *
  kernel) and multiplied by the group's weights (C/g * kernel, M/g) in one BLAS call; the
  products land in the result's channels of that group.
- pools: the maximum over the window axes, or the sum divided by the window's size (the
  count of non-padding positions unless `count_include_pad`).
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.kernels import dispatch


def _strided(xp):
    if xp is np:
        return np.lib.stride_tricks.as_strided
    import cupy
    return cupy.lib.stride_tricks.as_strided


def _attrs(attrs: dict, spatial: int):
    strides = tuple(attrs.get("strides") or (1,) * spatial)
    dilations = tuple(attrs.get("dilations") or (1,) * spatial)
    pads = tuple(attrs.get("pads") or (0,) * (2 * spatial))
    return strides, pads, dilations


def padded(x, pads, value, xp):
    """`x` with `pads` (begins, then ends, per spatial axis) of `value` around its spatial
    axes; `x` itself when there is none."""
    spatial = x.ndim - 2
    if not any(pads):
        return x
    shape = x.shape[:2] + tuple(s + pads[a] + pads[spatial + a]
                                for a, s in enumerate(x.shape[2:]))
    out = xp.full(shape, value, dtype=x.dtype)
    inner = (slice(None), slice(None)) + tuple(slice(pads[a], pads[a] + s)
                                               for a, s in enumerate(x.shape[2:]))
    out[inner] = x
    return out


def windows(xp_padded, kernel, strides, dilations, out_spatial, xp):
    """The view (N, C, *out, *kernel) of the windows of a padded input (no copy)."""
    x = xp.ascontiguousarray(xp_padded)
    s = x.strides
    shape = x.shape[:2] + tuple(out_spatial) + tuple(kernel)
    strides = s[:2] + tuple(s[2 + a] * strides[a] for a in range(len(kernel))) + \
        tuple(s[2 + a] * dilations[a] for a in range(len(kernel)))
    return _strided(xp)(x, shape=shape, strides=strides, writeable=False)


def out_spatial(x_shape, kernel, strides, pads, dilations) -> tuple[int, ...]:
    n = len(kernel)
    return tuple((x_shape[2 + a] + pads[a] + pads[n + a] - dilations[a] * (kernel[a] - 1) - 1)
                 // strides[a] + 1 for a in range(n))


def conv(x, w, attrs: dict):
    """The convolution of images `x` (N, C, *spatial) with weights `w` (M, C/g, *kernel)."""
    xp = dispatch.array_module(x, w)
    spatial = x.ndim - 2
    strides, pads, dilations = _attrs(attrs, spatial)
    groups = attrs.get("groups") or 1
    kernel = w.shape[2:]
    out_sp = out_spatial(x.shape, kernel, strides, pads, dilations)
    view = windows(padded(x, pads, 0, xp), kernel, strides, dilations, out_sp, xp)
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg = c // groups, m // groups
    positions = n * math.prod(out_sp)
    out = xp.empty((n,) + out_sp + (m,), dtype=x.dtype)  # channels last, then moved
    flat_out = out.reshape(positions, m)
    # window axes after the position axes: (N, *out, C/g, *kernel) per group
    order = (0,) + tuple(range(2, 2 + spatial)) + (1,) + tuple(range(2 + spatial, 2 + 2 * spatial))
    for g in range(groups):
        part = view[:, g * cg:(g + 1) * cg].transpose(order)
        columns = xp.ascontiguousarray(part).reshape(positions, cg * math.prod(kernel))
        weights = w[g * mg:(g + 1) * mg].reshape(mg, -1)
        if groups == 1:
            xp.matmul(columns, weights.T, out=flat_out)
        else:
            flat_out[:, g * mg:(g + 1) * mg] = columns @ weights.T
    return xp.ascontiguousarray(xp.moveaxis(out, -1, 1))


def pool(op: str, x, attrs: dict):
    """Max or average pooling of `x` (N, C, *spatial) over windows of `attrs["kernel"]`."""
    xp = dispatch.array_module(x)
    spatial = x.ndim - 2
    strides, pads, dilations = _attrs(attrs, spatial)
    kernel = tuple(attrs["kernel"])
    out_sp = out_spatial(x.shape, kernel, strides, pads, dilations)
    axes = tuple(range(2 + spatial, 2 + 2 * spatial))
    if op == "max_pool":
        lowest = -xp.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        view = windows(padded(x, pads, lowest, xp), kernel, strides, dilations, out_sp, xp)
        return xp.ascontiguousarray(view.max(axis=axes))
    view = windows(padded(x, pads, 0, xp), kernel, strides, dilations, out_sp, xp)
    # float64 sums (float32 windows of a few dozen values would do too; this matches the
    # engine's sums), rounded once.
    total = view.sum(axis=axes, dtype=np.float64)
    if attrs.get("count_include_pad") or not any(pads):
        return (total / math.prod(kernel)).astype(x.dtype)
    ones = xp.ones((1, 1) + x.shape[2:], dtype=np.float64)
    counts = windows(padded(ones, pads, 0, xp), kernel, strides, dilations, out_sp, xp)
    return (total / counts.sum(axis=axes)).astype(x.dtype)
