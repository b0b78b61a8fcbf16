"""ONNX's Resize as gathers: per resized axis, each output position reads a few input
positions (its taps) with fixed weights, all known while the graph is built.

Resize is separable: it resizes one axis after the other. For an axis of input length `L`
resized to `O` with scale `s`, output position `i` maps to the input coordinate `x` of the
coordinate transformation mode (half_pixel: `(i + 0.5) / s - 0.5`, ...); the `n` input
positions nearest `x` (ties to the smaller; `n` = 2 for nearest and linear, 4 for cubic,
more with antialias when shrinking) are its taps, clamped into the axis (edge padding), and
the interpolation mode gives their weights from `x`'s fraction (`exclude_outside` zeroes
the weights of taps outside the axis and renormalizes). As ONNX's reference computes.

In the graph: nearest is one `take` of the chosen taps (exact, any dtype); linear and cubic
are the float64 sum over taps of `take(x, tap k) * weight k`, rounded to the input's dtype
once.
"""

from __future__ import annotations

import math

import numpy as np

TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_coordinates(mode: str, out_len: int, in_len: int, scale: float) -> np.ndarray:
    """The input coordinate of each output position along one axis."""
    y = np.arange(out_len, dtype=np.float64)
    width = scale * in_len  # the output width as a real number (scales need not divide)
    if mode == "align_corners":
        return np.zeros(out_len) if width == 1 else y * (in_len - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "pytorch_half_pixel":
        return np.full(out_len, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    # half_pixel_symmetric: the centre of the input maps to the centre of the output
    offset = in_len / 2 * (1 - out_len / width)
    return offset + (y + 0.5) / scale - 0.5


def _cubic(ratio: float, a: float) -> list[float]:
    r = ratio
    return [((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a]


def _cubic_antialias(ratio: float, scale: float, a: float) -> list[float]:
    scale = min(scale, 1.0)

    def weight(v: float) -> float:
        v = abs(v)
        if v <= 1:
            return (a + 2) * v ** 3 - (a + 3) * v ** 2 + 1
        return a * v ** 3 - 5 * a * v ** 2 + 8 * a * v - 4 * a if v < 2 else 0.0

    start = int(math.floor(-2 / scale) + 1)
    raw = [weight(scale * (i - ratio)) for i in range(start, 2 - start)]
    return [w / sum(raw) for w in raw]


def _linear_antialias(ratio: float, scale: float) -> list[float]:
    scale = min(scale, 1.0)
    start = int(math.floor(-1 / scale) + 1)
    raw = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * scale), 0, 1)
    return list(raw / raw.sum())


def weights_of(mode: str, ratio: float, scale: float, *, nearest_mode: str, cubic_a: float,
               antialias: bool) -> list[float]:
    if mode == "nearest":
        if float(ratio).is_integer():
            return [0.0, 1.0]
        prefer = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                  "floor": False, "ceil": True}[nearest_mode]
        return [0.0, 1.0] if prefer else [1.0, 0.0]
    if mode == "linear":
        return _linear_antialias(ratio, scale) if antialias else [1 - ratio, ratio]
    return _cubic_antialias(ratio, scale, cubic_a) if antialias else _cubic(ratio, cubic_a)


def taps(mode: str, in_len: int, out_len: int, scale: float, transform: str, *,
         nearest_mode: str = "round_prefer_floor", cubic_a: float = -0.75,
         antialias: bool = False, exclude_outside: bool = False
         ) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each (out_len, n): the input positions each output position
    reads along one axis, clamped into it, and their weights."""
    x = source_coordinates(transform, out_len, in_len, scale)
    whole = np.floor(x)
    ratios = np.where(x == whole, 1.0, x - whole)
    weights = np.array([weights_of(mode, float(r), scale, nearest_mode=nearest_mode,
                                   cubic_a=cubic_a, antialias=antialias) for r in ratios])
    n = weights.shape[1]
    # the n positions nearest x, ties to the smaller (in edge-padded coordinates)
    pad = math.ceil(n / 2)
    shifted = x + pad
    p = np.floor(shifted).astype(np.int64)
    frac = shifted - p
    if n % 2 == 0:
        start = p + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        start = p + np.where(frac <= 0.5, base, base + 1)
    index = start[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        weights = np.where((index < 0) | (index >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, in_len - 1), weights
