"""Sliding-window kernels: N-D convolution (im2col and a GEMM per group) and pooling.

Written against the array module of the operands (NumPy, or CuPy on a GPU), so one code
states the semantics on both (`deepx_flow.ops.window` has the operators' definitions):

- The input is padded once (zeros for `conv` and `avg_pool`; the dtype's lowest value, -inf
  for floats, for `max_pool`, so padding never wins; NaN still propagates, as in NumPy's
  maximum).
- Each kernel offset reads one strided slice of the padded input (every image and channel,
  one tap of every output position's window).
- `conv`: a block of images at a time, those slices are copied into the im2col matrix
  (C/g x kernel rows, the block's output positions as columns) and multiplied by the
  group's weights (M/g, C/g x kernel) in one BLAS call.
- pools: the running maximum (or float64 sum) of the slices, the sum divided by the
  window's size (the count of non-padding positions unless `count_include_pad`).
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.kernels import dispatch


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


def out_spatial(x_shape, kernel, strides, pads, dilations) -> tuple[int, ...]:
    n = len(kernel)
    return tuple((x_shape[2 + a] + pads[a] + pads[n + a] - dilations[a] * (kernel[a] - 1) - 1)
                 // strides[a] + 1 for a in range(n))


def _offsets(kernel, strides, dilations, out_sp):
    """For each kernel offset, the slices of the padded input its taps read: one strided
    slice per spatial axis, `out` long."""
    import itertools
    for k in itertools.product(*[range(n) for n in kernel]):
        yield k, tuple(slice(k[a] * dilations[a], k[a] * dilations[a]
                             + (out_sp[a] - 1) * strides[a] + 1, strides[a])
                       for a in range(len(kernel)))


# Images per im2col block: its column matrix (C/g x kernel rows, this many images' output
# positions) stays in cache while the GEMM reads it (measured on 8,192 28x28 images: 8 to
# 16 channels run fastest with blocks of 64 to 256 images).
BLOCK_IMAGES = 64


def conv(x, w, attrs: dict):
    """The convolution of images `x` (N, C, *spatial) with weights `w` (M, C/g, *kernel).

    im2col by kernel offset, a block of images at a time: for each offset, one strided
    slice of the block's padded images is copied into its rows of the column matrix (C/g x
    kernel rows, images x out positions columns); then one GEMM per group,
    (M/g, K) @ (K, P), whose product is moved into the result's (N, M, *out) layout."""
    xp = dispatch.array_module(x, w)
    spatial = x.ndim - 2
    strides, pads, dilations = _attrs(attrs, spatial)
    groups = attrs.get("groups") or 1
    kernel = tuple(w.shape[2:])
    out_sp = out_spatial(x.shape, kernel, strides, pads, dilations)
    source = padded(x, pads, 0, xp)
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg = c // groups, m // groups
    taps = math.prod(kernel)
    offsets = [index for _, index in _offsets(kernel, strides, dilations, out_sp)]
    weights = [w[g * mg:(g + 1) * mg].reshape(mg, cg * taps) for g in range(groups)]
    out = xp.empty((n, m) + out_sp, dtype=x.dtype)
    block = max(1, min(n, BLOCK_IMAGES))
    columns = xp.empty((cg, taps, block) + out_sp, dtype=x.dtype)
    product = xp.empty((mg, block) + out_sp, dtype=x.dtype)
    for start in range(0, n, block):
        b = min(block, n - start)
        cols = columns[:, :, :b]
        prod = product if b == block else xp.empty((mg, b) + out_sp, dtype=x.dtype)
        for g in range(groups):
            images = source[start:start + b, g * cg:(g + 1) * cg]
            for t, index in enumerate(offsets):
                xp.copyto(cols[:, t], xp.moveaxis(images[(slice(None), slice(None)) + index],
                                                   1, 0))
            xp.matmul(weights[g], cols.reshape(cg * taps, -1), out=prod.reshape(mg, -1))
            out[start:start + b, g * mg:(g + 1) * mg] = xp.moveaxis(prod, 0, 1)
    return out


def pool(op: str, x, attrs: dict):
    """Max or average pooling of `x` (N, C, *spatial) over windows of `attrs["kernel"]`:
    the maximum (or sum) of one strided slice of the padded input per kernel offset."""
    xp = dispatch.array_module(x)
    spatial = x.ndim - 2
    strides, pads, dilations = _attrs(attrs, spatial)
    kernel = tuple(attrs["kernel"])
    out_sp = out_spatial(x.shape, kernel, strides, pads, dilations)
    lead = (slice(None), slice(None))
    if op == "max_pool":
        lowest = -xp.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        source = padded(x, pads, lowest, xp)
        out = None
        for _, index in _offsets(kernel, strides, dilations, out_sp):
            part = source[lead + index]
            if out is None:
                out = part.copy()
            else:  # fmax would drop NaN; maximum keeps it, as NumPy's max does
                xp.maximum(out, part, out=out)
        return out
    source = padded(x, pads, 0, xp)
    total = xp.zeros(x.shape[:2] + out_sp, dtype=np.float64)
    for _, index in _offsets(kernel, strides, dilations, out_sp):
        total += source[lead + index]
    if attrs.get("count_include_pad") or not any(pads):
        total /= math.prod(kernel)
    else:
        ones = padded(xp.ones((1, 1) + x.shape[2:], dtype=np.float64), pads, 0, xp)
        counts = xp.zeros((1, 1) + out_sp, dtype=np.float64)
        for _, index in _offsets(kernel, strides, dilations, out_sp):
            counts += ones[lead + index]
        total /= counts
    return total.astype(x.dtype)
