"""Depthwise convolutions on a CPU (one filter per channel, groups = channels), compiled
with numba: MobileNet-style networks spend most of their time here, and NumPy's form of it
(`window._direct`, a pass over the output per tap) runs 5 to 15 times slower than ONNX
Runtime's kernel.

Each output is the sum of its taps in the order `window._direct` adds them (row by row of
the kernel, starting from the first tap's product), in the input's dtype, with no fused
multiply-add: the same numbers, signed zeros included.
Two loop orders, chosen by the width of the input rows (`by_rows`):
- `_by_rows` (rows of WIDE_ROWS values and more): for each image and channel, copied into
  a padded plane of a few KiB that stays in cache, each output row gains each tap times a
  strided row of the plane, a loop the compiler vectorizes along the row;
- `_by_channels` (shorter rows: the later layers, 28 x 28 and less, with more channels): an
  image at a time is copied channels last, (H, W, C), padded as it is copied, so the
  innermost loop runs along the channels, and copied back. The copy reads every input
  value, so a stride of 2 over wide rows (four inputs an output) is left to `_by_rows`.
Neither makes a padded copy of a block of images. Both read them in either layout the chains
use, images first (N, C, H, W) or channels first (C, N, H, W), and write the result in
either.
"""

from __future__ import annotations

import numpy as np

# Input rows at least this wide take `_by_rows` (measured on a 2-core EPYC, 16 images:
# 16 channels of 56-wide rows run 2.6x faster by rows; 240 channels of 14-wide rows 3x
# faster by channels; 72 and 88 channels of 28-wide rows about alike; 4 images, 72 channels
# of 56-wide rows at stride 2 (28-wide output rows): 0.83 ms by rows, 1.54 ms by channels).
WIDE_ROWS = 56
DTYPES = ("float32", "float64")


def by_rows(width: int) -> bool:
    """Whether images of rows `width` wide (unpadded) take `_by_rows`."""
    return width >= WIDE_ROWS


def depthwise(source, w, strides, dilations, channels_first: bool, out_channels_first: bool,
              out, pads=None):
    """Fill `out` with the depthwise convolution of the images `source` ((N, C, H, W), or
    (C, N, H, W) when `channels_first`) by `w` (C, 1, kh, kw); `out` is (N, C, *out), or
    (C, N, *out) when `out_channels_first`. 2-D, float32 or float64. `pads` (top, left,
    bottom, right) says how much zero padding is around the images, None for none: they
    are never copied padded (the kernels read zeros there)."""
    return plan(w, strides, dilations, channels_first, out_channels_first,
                pads or (0, 0, 0, 0), source.shape[3])(source, out)


def plan(w, strides, dilations, channels_first: bool, out_channels_first: bool, pads,
         width: int):
    """`depthwise` of images `width` wide, its loop order chosen and the weights laid out
    once: a function of (source, out)."""
    kernel = _compiled()[0 if by_rows(width) else 1]
    taps = _taps(w)
    sh, sw = strides
    dh, dw = dilations
    top, left, bottom, right = pads

    def along(source, out):
        kernel(source, taps, sh, sw, dh, dw, top, left, source.shape[2] + top + bottom,
               source.shape[3] + left + right, channels_first, out_channels_first, out)
        return out
    return along


def _taps(w):
    """The weights (C, 1, kh, kw) as the kernels read them: (C, kh, kw), contiguous."""
    return np.ascontiguousarray(w.reshape(w.shape[0], w.shape[2], w.shape[3]))


_KERNELS = None


def _compiled():
    """The two kernels, compiled on first use (numba is imported then, not with the
    package). Their machine code is cached on disk for the next process where numba finds a
    writable place (the package's __pycache__, else the user's cache folder); where it finds
    none, they are compiled in each process instead of failing."""
    global _KERNELS
    if _KERNELS is None:
        import numba

        def compile_(f):
            try:
                return numba.njit(cache=True, nogil=True, boundscheck=False)(f)
            except RuntimeError:  # "cannot cache function ...: no locator available"
                return numba.njit(nogil=True, boundscheck=False)(f)
        _KERNELS = (compile_(_by_rows), compile_(_by_channels))
    return _KERNELS


def _by_rows(source, taps, sh, sw, dh, dw, top, left, hp, wp, channels_first,
             out_channels_first, out):
    if channels_first:
        c, n = source.shape[0], source.shape[1]
    else:
        n, c = source.shape[0], source.shape[1]
    height, width = source.shape[2], source.shape[3]
    kh, kw = taps.shape[1], taps.shape[2]
    ho, wo = out.shape[2], out.shape[3]
    # one image's channel, padded (hp x wp: a few KiB, in cache), its border of zeros
    # written once
    padded = np.zeros((hp, wp), source.dtype)
    # a row of sums of its own: the compiler then knows it overlaps no input row, and
    # vectorizes the loops below
    acc = np.empty(wo, source.dtype)
    for b in range(n):
        for ch in range(c):
            plane = source[ch, b] if channels_first else source[b, ch]
            for y in range(height):
                row, inner = plane[y], padded[top + y, left:]
                for x in range(width):
                    inner[x] = row[x]
            result = out[ch, b] if out_channels_first else out[b, ch]
            for h in range(ho):
                first = True
                for i in range(kh):
                    line = padded[h * sh + i * dh]
                    for j in range(kw):
                        weight = taps[ch, i, j]
                        # a view from the tap on: indices from 0 with a constant step
                        # (strides 1 and 2 spelled out) are what the compiler vectorizes
                        seg = line[j * dw:]
                        if first:
                            for q in range(wo):
                                acc[q] = seg[sw * q] * weight
                            first = False
                        elif sw == 1:
                            for q in range(wo):
                                acc[q] += seg[q] * weight
                        elif sw == 2:
                            for q in range(wo):
                                acc[q] += seg[2 * q] * weight
                        else:
                            for q in range(wo):
                                acc[q] += seg[sw * q] * weight
                result[h, :] = acc
    return out


def _by_channels(source, taps, sh, sw, dh, dw, top, left, hp, wp, channels_first,
                 out_channels_first, out):
    if channels_first:
        c, n = source.shape[0], source.shape[1]
    else:
        n, c = source.shape[0], source.shape[1]
    height, width = source.shape[2], source.shape[3]
    kh, kw = taps.shape[1], taps.shape[2]
    ho, wo = out.shape[2], out.shape[3]
    image = np.empty((hp, wp, c), source.dtype)  # one image, channels last, padded
    for y in range(hp):  # its border of zeros, written once
        for x in range(wp):
            if y < top or y >= top + height or x < left or x >= left + width:
                image[y, x, :] = 0
    result = np.empty((ho, wo, c), source.dtype)
    weights = np.empty((kh, kw, c), source.dtype)
    for ch in range(c):
        for i in range(kh):
            for j in range(kw):
                weights[i, j, ch] = taps[ch, i, j]
    for b in range(n):
        for y in range(height):
            for x in range(width):
                pixel = image[top + y, left + x]
                for ch in range(c):
                    pixel[ch] = source[ch, b, y, x] if channels_first else source[b, ch, y, x]
        for h in range(ho):
            for q in range(wo):
                acc = result[h, q]
                for i in range(kh):
                    for j in range(kw):
                        pixel = image[h * sh + i * dh, q * sw + j * dw]
                        weight = weights[i, j]
                        if i == 0 and j == 0:
                            for ch in range(c):
                                acc[ch] = pixel[ch] * weight[ch]
                        else:
                            for ch in range(c):
                                acc[ch] += pixel[ch] * weight[ch]
        for ch in range(c):
            plane = out[ch, b] if out_channels_first else out[b, ch]
            for h in range(ho):
                for q in range(wo):
                    plane[h, q] = result[h, q, ch]
    return out
