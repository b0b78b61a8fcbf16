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
  group's weights (M/g, C/g x kernel) in one BLAS call. A grouped convolution with few
  channels per group (a depthwise one has one) is computed directly instead (`_direct`):
  for each tap and input channel of a group, every group's output channels at once gain the
  tap's weight times that slice; a GEMM per group of one channel is a Python loop over the
  channels of tiny products.
- pools: the running maximum (or float64 sum) of the slices, the sum divided by the
  window's size (the count of non-padding positions unless `count_include_pad`).
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.kernels import compiled, depthwise_cpu, dispatch, max_pool_cpu


def _attrs(attrs: dict, spatial: int):
    strides = tuple(attrs.get("strides") or (1,) * spatial)
    dilations = tuple(attrs.get("dilations") or (1,) * spatial)
    pads = tuple(attrs.get("pads") or (0,) * (2 * spatial))
    return strides, pads, dilations


def buffer(scratch, tag, shape, dtype, xp, fill=None):
    """A buffer of `shape`: `scratch[tag]` when it has that shape and dtype (its values are
    whatever was last written), else a new one (filled with `fill` if given), kept there.

    Why: a batch chain (`kernels/batch_chain.py`) calls these kernels for hundreds of blocks
    of images per task; on a Dask worker (glibc trims freed memory at once there) every
    fresh block-sized array faulted its pages in again, which tripled a chain's time."""
    held = None if scratch is None else scratch.get(tag)
    if held is not None and held.shape == tuple(shape) and held.dtype == dtype:
        return held
    out = xp.empty(shape, dtype=dtype) if fill is None else xp.full(shape, fill, dtype=dtype)
    if scratch is not None:
        scratch[tag] = out
    return out


def padded(x, pads, value, xp, scratch=None):
    """`x` with `pads` (begins, then ends, per spatial axis) of `value` around its spatial
    axes; `x` itself when there is none. With `scratch`, the padded array is a kept buffer
    whose border holds `value` from when it was made: only the inside is written again."""
    spatial = x.ndim - 2
    if not any(pads):
        return x
    shape = x.shape[:2] + tuple(s + pads[a] + pads[spatial + a]
                                for a, s in enumerate(x.shape[2:]))
    out = buffer(scratch, ("padded", value), shape, x.dtype, xp, fill=value)
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


def conv(x, w, attrs: dict, scratch: dict | None = None, channels_first: bool = False,
         out_channels_first: bool | None = None):
    """The convolution of images `x` (N, C, *spatial) with weights `w` (M, C/g, *kernel).

    im2col by kernel offset, a block of images at a time: for each offset, one strided
    slice of the block's padded images is copied into its rows of the column matrix (C/g x
    kernel rows, images x out positions columns); then one GEMM per group,
    (M/g, K) @ (K, P), whose product is moved into the result's (N, M, *out) layout.
    `scratch` (see `buffer`) keeps the buffers for the next call, the result among them.

    `channels_first`: `x` is laid out (C, N, *spatial); `out_channels_first` (by default the
    same): the result is laid out (M, N, *out), the GEMM's own layout, so a chain of layers
    (`kernels/batch_chain.py`) moves no axes between them."""
    return conv_plan(x, w, attrs, scratch, channels_first, out_channels_first)(x)


def conv_plan(x, w, attrs: dict, scratch: dict | None = None, channels_first: bool = False,
              out_channels_first: bool | None = None, view_ok: bool = False):
    """`conv` for images of the shape, dtype and array module of `x`, its way chosen and
    its operands laid out once: a function of such images. A batch chain calls it for each
    block of images, where deciding again each time cost as much as a small layer.
    `view_ok`: the result may be a strided view (of a buffer of the plan's)."""
    xp = dispatch.array_module(x, w)
    spatial = x.ndim - 2
    strides, pads, dilations = _attrs(attrs, spatial)
    groups = attrs.get("groups") or 1
    kernel = tuple(w.shape[2:])
    out_sp = out_spatial(x.shape, kernel, strides, pads, dilations)
    if out_channels_first is None:
        out_channels_first = channels_first
    (c, n), m = (x.shape[:2] if channels_first else x.shape[1::-1]), w.shape[0]
    cg, mg = c // groups, m // groups
    out_shape = ((m, n) if out_channels_first else (n, m)) + out_sp
    if groups > 1 and _compiled_depthwise(x, w, cg, mg, spatial, xp):  # reads no padded copy
        depthwise = depthwise_cpu.plan(w, strides, dilations, channels_first,
                                       out_channels_first, (pads[0], pads[1], pads[2],
                                                            pads[3]), x.shape[3])
        out = buffer(scratch, "out", out_shape, x.dtype, xp)
        return lambda x: depthwise(x, out)
    if groups > 1 and cg <= DIRECT_GROUP_CHANNELS:
        def direct(x):
            source = padded(x, pads, 0, xp, scratch)
            return _direct(source, w, (kernel, strides, dilations, out_sp),
                           (n, groups, cg, mg), channels_first, out_channels_first, scratch,
                           xp)
        return direct
    if groups == 1 and all(k == 1 for k in kernel) and all(s == 1 for s in strides) \
            and not any(pads):
        return _pointwise_plan(x, w, channels_first, out_channels_first, scratch, xp)
    if xp is np and groups == 1 and spatial == 2 and channels_first and out_channels_first \
            and all(s == 1 for s in strides):
        return _shifted_plan(x, w, (kernel, pads, dilations, out_sp), scratch, view_ok)
    return lambda x: _im2col(x, w, (kernel, strides, pads, dilations, out_sp),
                             (n, c, m, groups), channels_first, out_channels_first,
                             scratch, xp)


def _im2col(x, w, window, sizes, channels_first: bool, out_channels_first: bool, scratch,
            xp):
    """`conv` by im2col: see there."""
    kernel, strides, pads, dilations, out_sp = window
    n, c, m, groups = sizes
    cg, mg = c // groups, m // groups
    source = padded(x, pads, 0, xp, scratch)
    taps = math.prod(kernel)
    offsets = [(slice(None), slice(None)) + index
               for _, index in _offsets(kernel, strides, dilations, out_sp)]
    weights = [w[g * mg:(g + 1) * mg].reshape(mg, cg * taps) for g in range(groups)]
    out = buffer(scratch, "out", ((m, n) if out_channels_first else (n, m)) + out_sp, x.dtype,
                 xp)
    block = max(1, min(n, BLOCK_IMAGES))
    columns = buffer(scratch, "columns", (cg, taps, block) + out_sp, x.dtype, xp)
    for start in range(0, n, block):
        b = min(block, n - start)
        cols = columns[:, :, :b]
        for g in range(groups):
            channels, images = slice(g * cg, (g + 1) * cg), slice(start, start + b)
            filters = slice(g * mg, (g + 1) * mg)
            for t, index in enumerate(offsets):
                if channels_first:
                    xp.copyto(cols[:, t], source[channels, images][index])
                else:
                    xp.copyto(cols[:, t], xp.moveaxis(source[images, channels][index], 1, 0))
            if out_channels_first and groups == 1 and b == n:  # the product is the result
                xp.matmul(weights[g], cols.reshape(cg * taps, -1), out=out.reshape(m, -1))
                continue
            prod = buffer(scratch, "product", (mg, block) + out_sp, x.dtype, xp) \
                if b == block else xp.empty((mg, b) + out_sp, dtype=x.dtype)
            xp.matmul(weights[g], cols.reshape(cg * taps, -1), out=prod.reshape(mg, -1))
            if out_channels_first:
                out[filters, images] = prod
            else:
                out[images, filters] = xp.moveaxis(prod, 0, 1)
    return out


def _shifted_plan(x, w, window, scratch, view_ok: bool):
    """A 2-D convolution of stride 1 of images laid out channels first, (C, N, H, W), by
    im2col over a padded grid: the block's images are written into one flat buffer per
    channel with zeros between them, and the column matrix's row for a channel and a tap is
    that buffer shifted by the tap's offset, one contiguous copy of the grid (where
    `_im2col` copies a row of W values at a time: 14 in a small conv net, whose im2col cost
    more than its GEMM). The GEMM runs over every position of the grid, and the result is
    its valid corner, (M, N, Ho, Wo): a strided view where `view_ok`, else copied. The same
    products and sums as `_im2col` (the taps in the same order), to within BLAS's rounding
    for another number of columns.

    Neighbours share their padding: one run of zero columns is the right padding of a row
    and the left padding of the next, one run of zero rows the bottom of an image and the
    top of the next. A 3x3 convolution padded by 1 of 14x14 images then computes 15 x 15
    positions an image where separate padding made it 16 x 16: 12% less GEMM and copying."""
    kernel, pads, dilations, out_sp = window
    c, n, height, width = x.shape
    m, item = w.shape[0], x.dtype.itemsize
    top, left, bottom, right = pads
    # the zeros between rows (and images) cover both paddings, and leave room in the grid
    # for every valid output (a padding wider than the kernel's reach makes more outputs)
    gap_rows = max(top, bottom, out_sp[0] - height)
    gap_columns = max(left, right, out_sp[1] - width)
    row = width + gap_columns
    image = (height + gap_rows) * row
    grid = n * image
    reach = (kernel[0] - 1) * dilations[0] * row + (kernel[1] - 1) * dilations[1]
    # the grid's position p, shifted by a tap's offset, reads the input pixel that tap
    # meets: images start `first` into the buffer, after the top padding of the first
    first = top * row + left
    # zeros around the images (and past the grid, which the last taps read) stay zero: only
    # the images are written again for each block
    flat = buffer(scratch, "shifted_images", (c, first + grid + reach), x.dtype, np, fill=0)
    inside = flat[:, first:first + grid].reshape(c, n, height + gap_rows, row)[
        :, :, :height, :width]
    columns = buffer(scratch, "columns", (c, kernel[0], kernel[1], grid), x.dtype, np)
    shifted = np.lib.stride_tricks.as_strided(
        flat, shape=columns.shape,
        strides=(flat.strides[0], dilations[0] * row * item, dilations[1] * item, item))
    weights = w.reshape(m, -1)
    product = buffer(scratch, "product", (m, grid), x.dtype, np)
    valid = product.reshape(m, n, height + gap_rows, row)[:, :, :out_sp[0], :out_sp[1]]
    out = None if view_ok else buffer(scratch, "out", (m, n) + out_sp, x.dtype, np)

    def shifted_columns(x):
        inside[...] = x
        np.copyto(columns, shifted)
        np.matmul(weights, columns.reshape(weights.shape[1], grid), out=product)
        if out is None:
            return valid
        np.copyto(out, valid)
        return out
    return shifted_columns


def _pointwise_plan(x, w, channels_first: bool, out_channels_first: bool, scratch, xp):
    """A 1x1 convolution (stride 1, no padding) is a product over the channels: one GEMM
    (M, C) @ (C, images x positions) of images laid out channels first, or a batch of them,
    one per image, (M, C) @ (C, positions); no column matrix is copied."""
    m, c = w.shape[:2]
    weights = w.reshape(m, c)
    if channels_first:
        n = x.shape[1]
        out = buffer(scratch, "out", (m, n) + x.shape[2:], x.dtype, xp)
        if out_channels_first:
            product = out.reshape(m, -1)

            def channels_first_in_and_out(x):
                xp.matmul(weights, x.reshape(c, -1), out=product)
                return out
            return channels_first_in_and_out
        result = buffer(scratch, "images_first_out", (n, m) + x.shape[2:], x.dtype, xp)

        def images_first_out(x):
            product = xp.matmul(weights, x.reshape(c, -1)).reshape((m, n) + x.shape[2:])
            xp.copyto(result, xp.moveaxis(product, 0, 1))
            return result
        return images_first_out
    n = x.shape[0]
    out = buffer(scratch, "out", (n, m) + x.shape[2:], x.dtype, xp)
    per_image = out.reshape(n, m, -1)
    result = buffer(scratch, "channels_first_out", (m, n) + x.shape[2:], x.dtype, xp) \
        if out_channels_first else None

    def images_first_in(x):
        xp.matmul(weights, x.reshape(n, c, -1), out=per_image)
        if result is None:
            return out
        xp.copyto(result, xp.moveaxis(out, 0, 1))
        return result
    return images_first_in


def _compiled_depthwise(x, w, cg: int, mg: int, spatial: int, xp) -> bool:
    """Whether a grouped convolution runs compiled (`depthwise_cpu`): on a CPU, one input
    and one output channel per group, 2-D, images and weights of one dtype it takes."""
    return xp is np and cg == 1 and mg == 1 and spatial == 2 and w.dtype == x.dtype \
        and x.dtype.name in depthwise_cpu.DTYPES and compiled.allowed()


# Grouped convolutions with at most this many input channels per group take `_direct`.
DIRECT_GROUP_CHANNELS = 4
# `_direct` accumulates a block of images whose output holds about this many bytes: it stays
# in a core's cache across the taps.
DIRECT_BLOCK_BYTES = 1 << 19


def _direct(source, w, window, sizes, channels_first: bool, out_channels_first: bool,
            scratch, xp):
    """A grouped convolution computed tap by tap: for output channel j of every group and
    input channel k of every group, the groups' outputs (one strided view: channels j,
    j + mg, ...) gain `w[:, k, tap]` times the tap's slice of the groups' inputs (channels k,
    k + cg, ...). float32 and float64 accumulate in their own dtype, a sum of C/g x kernel
    terms per output, as a GEMM of that depth does; float16 in float32 (as NumPy's float16
    matmul does), rounded once. On a CPU a depthwise convolution (one input and one output
    channel per group, 2-D) runs compiled (`depthwise_cpu`): the same sums, 5 to 10 times
    faster."""
    kernel, strides, dilations, out_sp = window
    n, groups, cg, mg = sizes
    if source.dtype == np.float16:
        wide = _direct(source.astype(np.float32), w.astype(np.float32), window, sizes,
                       channels_first, out_channels_first, None, xp)
        out = buffer(scratch, "out", wide.shape, source.dtype, xp)
        xp.copyto(out, wide, casting="unsafe")
        return out
    out_shape = ((groups * mg, n) if out_channels_first else (n, groups * mg)) + out_sp
    if _compiled_depthwise(source, w, cg, mg, len(out_sp), xp):
        return depthwise_cpu.depthwise(source, w, strides,
                                       dilations, channels_first, out_channels_first,
                                       buffer(scratch, "out", out_shape, source.dtype, xp))
    src = source if channels_first else source.swapaxes(0, 1)  # (C, N, *spatial): a view
    out = buffer(scratch, "out", out_shape, source.dtype, xp)
    dst = out if out_channels_first else out.swapaxes(0, 1)   # (M, N, *out)
    taps = [index for _, index in _offsets(kernel, strides, dilations, out_sp)]
    spatial_weight = (1,) * (1 + len(out_sp))
    per_image = groups * math.prod(out_sp) * source.dtype.itemsize
    block = max(1, min(n, DIRECT_BLOCK_BYTES // max(1, per_image)))
    product = buffer(scratch, "direct_product", (groups, block) + out_sp, source.dtype, xp)
    for j in range(mg):
        for start in range(0, n, block):
            images = slice(start, min(n, start + block))
            acc = dst[j::mg, images]  # every group's output channel j: (G, b, *out)
            term = product[:, :acc.shape[1]]
            first = True
            for k in range(cg):
                inputs = src[k::cg, images]  # every group's input channel k
                weights = w[j::mg, k].reshape(groups, -1)
                for t, index in enumerate(taps):
                    scale = weights[:, t].reshape((groups,) + spatial_weight)
                    if first:
                        xp.multiply(inputs[(slice(None), slice(None)) + index], scale, out=acc)
                        first = False
                        continue
                    xp.multiply(inputs[(slice(None), slice(None)) + index], scale, out=term)
                    xp.add(acc, term, out=acc)
    return out


def pool(op: str, x, attrs: dict, scratch: dict | None = None):
    """Max or average pooling of `x` (N, C, *spatial) over windows of `attrs["kernel"]`:
    the maximum (or sum) of one strided slice of the padded input per kernel offset.
    `scratch` (see `buffer`) keeps max_pool's buffers for the next call, the result among
    them."""
    return pool_plan(op, x, attrs, scratch)(x)


def pool_plan(op: str, x, attrs: dict, scratch: dict | None = None):
    """`pool` for inputs of the shape, dtype, strides and array module of `x`, its way
    chosen once: a function of such inputs (see `conv_plan`)."""
    xp = dispatch.array_module(x)
    strides, pads, dilations = _attrs(attrs, x.ndim - 2)
    kernel = tuple(attrs["kernel"])
    if op == "max_pool" and xp is np and max_pool_cpu.takes(x, kernel, strides, pads,
                                                             dilations):
        out_sp = out_spatial(x.shape, kernel, strides, pads, dilations)
        return max_pool_cpu.plan(x, buffer(scratch, "out", x.shape[:2] + out_sp, x.dtype,
                                           xp))
    return lambda x: _pool(op, x, (kernel, strides, pads, dilations), attrs, scratch, xp)


def _pool(op: str, x, window, attrs: dict, scratch, xp):
    """`pool` by NumPy (or CuPy) operations on strided slices."""
    kernel, strides, pads, dilations = window
    out_sp = out_spatial(x.shape, kernel, strides, pads, dilations)
    lead = (slice(None), slice(None))
    if op == "max_pool":
        lowest = -xp.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        source = padded(x, pads, lowest, xp, scratch)
        parts = [source[lead + index]
                 for _, index in _offsets(kernel, strides, dilations, out_sp)]
        if len(parts) == 1:
            return parts[0].copy()
        out = buffer(scratch, "out", parts[0].shape, x.dtype, xp)
        # fmax would drop NaN; maximum keeps it, as NumPy's max does
        xp.maximum(parts[0], parts[1], out=out)
        for part in parts[2:]:
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
