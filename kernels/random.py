"""Counter-based random numbers: any region of a random tensor, computed on its own.

An element's value depends only on (seed, its flat row-major index in the whole tensor), never
on the chunk grid, on the order chunks run in or on how many workers run them: a chunk is made
from its own indices, with no generator state carried between chunks.

The generator is splitmix64 (Steele, Lea and Flood, 2014) used as a hash of a counter: element
i of a uniform tensor takes output number i of a splitmix64 stream whose starting state is a
hash of (seed, operator); a normal element takes outputs 2i and 2i+1 as its two uniforms.
splitmix64 passes BigCrush, and everything here is uint64 adds, multiplies, shifts and xors,
which NumPy and CuPy compute bit for bit alike (wrapping modulo 2**64).

- Uniform: `u = (h >> 11) * 2**-53` is one of the 2**53 evenly spaced values in [0, 1);
  `low + (high - low) * u` is then rounded to the dtype and clamped into
  [the smallest dtype value >= low, the largest dtype value < high], so results stay strictly
  below `high` even where rounding to float32 or float16 would reach it.
- Normal: Box-Muller, `sqrt(-2 log u1) * cos(2 pi u2)` with u1 in (0, 1] and u2 in [0, 1),
  computed in float64, then `mean + std * z` rounded to the dtype. Only the cosine branch is
  used, so each element stays a function of its own index. The tails are cut at 8.57 standard
  deviations (u1 >= 2**-53). The uniforms are bit-identical on NumPy and CuPy; log, sqrt and
  cos may differ in the last bit of float64 between the two libraries.

Memory. Values are made in blocks of at most `BLOCK_ELEMENTS` (NumPy) or
`GPU_BLOCK_ELEMENTS` (CuPy) elements, written straight into the output. Inside a block,
scratch is 24 bytes per element for normal (two uint64 counters reused in place as the float64
uniforms, one uint64 temporary) and 16 bytes per element for uniform (one counter, one
temporary). So a chunk needs its output plus at most 24 * 65536 bytes = 1.5 MiB (NumPy) or
24 * 2**20 bytes = 24 MiB (CuPy), whatever its size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from deepx_flow.errors import ExecutionError
from deepx_flow.ir.dtypes import is_float
from deepx_flow.kernels import bfloat16, recycled
from deepx_flow.kernels.fused_cpu import iter_blocks

BLOCK_ELEMENTS = 1 << 16
GPU_BLOCK_ELEMENTS = 1 << 20
SCRATCH_BYTES_PER_ELEMENT = {"random_normal": 24, "random_uniform": 16}

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment (2**64 / golden ratio, odd)
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
# Salts keep the normal and uniform streams of one seed unrelated.
_SALT = {"random_normal": 0x6E6F726D616C0001, "random_uniform": 0x756E69666F726D02}
_DEFAULTS = {"random_normal": {"mean": 0.0, "std": 1.0},
             "random_uniform": {"low": 0.0, "high": 1.0}}


def mix64(z: int) -> int:
    """splitmix64's output function on a Python int (the scalar twin of the array code)."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def stream_key(op: str, seed: int) -> int:
    """The splitmix64 starting state of an operator's stream for `seed`."""
    return mix64((int(seed) & _MASK) ^ _SALT[op])


def random_chunk(op: str, seed: int, params: Mapping[str, float], full_shape, region,
                 dtype: str, xp: ModuleType = np) -> Any:
    """The values of a region of a counter-based random tensor.

    Parameters
    ----------
    op
        "random_normal" (params `mean`, `std`) or "random_uniform" (params `low`, `high`).
    seed
        The tensor's seed (an int; only its low 64 bits matter).
    params
        The distribution's parameters; missing ones take the defaults (mean 0, std 1; low 0,
        high 1).
    full_shape
        The shape of the whole tensor.
    region
        One `(start, stop)` pair per axis of `full_shape`: the chunk to compute.
    dtype
        A floating dtype name: "float16", "bfloat16", "float32" or "float64".
    xp
        The array module to compute with, numpy or cupy.

    Returns
    -------
    array
        A new array of `xp`, of shape `(stop - start, ...)` and dtype `dtype`. Element `idx` of
        the region holds the value of flat index `ravel_multi_index(start + idx, full_shape)`
        of the whole tensor.

    Raises
    ------
    ExecutionError
        For an unknown operator, a non-float dtype, bad parameters, or a region outside
        `full_shape`.
    """
    if op not in _DEFAULTS:
        raise ExecutionError(f"unknown random operator {op!r}; use random_normal or "
                             "random_uniform")
    if not is_float(dtype):
        raise ExecutionError(f"{op} makes floating-point values, not {dtype}")
    unknown = set(params) - set(_DEFAULTS[op])
    if unknown:
        raise ExecutionError(f"{op} takes parameters {', '.join(_DEFAULTS[op])}, not "
                             f"{', '.join(sorted(unknown))}")
    p = {**_DEFAULTS[op], **{k: float(v) for k, v in dict(params).items()}}
    full_shape, region = _check_region(op, full_shape, region)
    if not full_shape:
        # A 0-d tensor is element 0; computed as a 1-element vector, since NumPy turns 0-d
        # results of arithmetic into scalars, which cannot be written into in place.
        one = random_chunk(op, seed, params, (1,), ((0, 1),), dtype, xp)
        return one.reshape(())
    shape = tuple(stop - start for start, stop in region)
    out = recycled.empty(shape, dtype) if xp is np else xp.empty(shape, dtype=dtype)
    if math.prod(shape) == 0:
        return out
    strides = [math.prod(full_shape[i + 1:]) for i in range(len(full_shape))]
    key = stream_key(op, seed)
    block = BLOCK_ELEMENTS if xp is np else GPU_BLOCK_ELEMENTS
    if op == "random_uniform":
        low, high = p["low"], p["high"]
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ExecutionError(f"random_uniform needs finite low < high, got low={low}, "
                                 f"high={high}")
        lo, hi = uniform_bounds(low, high, dtype)
        if lo > hi:
            raise ExecutionError(f"random_uniform: no {dtype} value lies in [{low}, {high}); "
                                 "widen the range or use a wider dtype")
    else:
        mean, std = p["mean"], p["std"]
        if not (math.isfinite(mean) and math.isfinite(std) and std >= 0):
            raise ExecutionError(f"random_normal needs a finite mean and std >= 0, got "
                                 f"mean={mean}, std={std}")
    with np.errstate(all="ignore") if xp is np else contextlib.nullcontext():
        for key_block in iter_blocks(shape, block):
            idx = _flat_index(key_block, region, strides, xp)
            target = out[key_block]
            if op == "random_uniform":
                u = _uniform(idx, key, xp)
                xp.multiply(u, np.float64(high - low), out=u)
                xp.add(u, np.float64(low), out=u)
                _round_into(target, u, xp)
                # Rounding to the dtype may land on high (or below low): clamp inside.
                xp.minimum(target, hi, out=target)
                xp.maximum(target, lo, out=target)
                del u
            else:
                z = _normal(idx, key, xp)
                xp.multiply(z, np.float64(std), out=z)
                xp.add(z, np.float64(mean), out=z)
                _round_into(target, z, xp)
                del z
            # Drop this block's arrays before the next block allocates its own.
            del idx, target
    return out


def _round_into(target, values, xp) -> None:
    """float64 `values` rounded into `target` (once, also to bfloat16: `kernels.bfloat16`)."""
    if xp is np:
        bfloat16.copyto(target, values)
    else:
        xp.copyto(target, values, casting="unsafe")


def _check_region(op, full_shape, region):
    full_shape = tuple(int(s) for s in full_shape)
    region = tuple((int(a), int(b)) for a, b in region)
    if len(region) != len(full_shape) or any(
            not 0 <= a <= b <= s for (a, b), s in zip(region, full_shape)):
        raise ExecutionError(f"{op}: region {region} is not inside shape {full_shape}; give "
                             "one (start, stop) per axis with 0 <= start <= stop <= size")
    return full_shape, region


def uniform_bounds(low: float, high: float, dtype: str) -> tuple[Any, Any]:
    """The smallest dtype value >= low and the largest dtype value < high."""
    t = np.dtype(dtype).type
    with np.errstate(all="ignore"):
        lo, hi = t(low), t(high)
        if float(lo) < low:
            lo = np.nextafter(lo, t(np.inf))
        if float(hi) >= high:
            hi = np.nextafter(hi, t(-np.inf))
    return lo, hi


def _flat_index(key_block, region, strides, xp) -> Any:
    """uint64 flat indices (in the whole tensor) of the elements of one block of the region."""
    ndim = len(region)
    lead = len(key_block) - 1  # axes indexed by one integer, then one sliced axis
    offset = sum((region[i][0] + key_block[i]) * strides[i] for i in range(lead))
    sl = key_block[lead]
    block_shape = (sl.stop - sl.start,) + tuple(b - a for a, b in region[lead + 1:])
    idx = None
    for axis in range(lead, ndim):
        start = region[axis][0] + (sl.start if axis == lead else 0)
        n = block_shape[axis - lead]
        v = xp.arange(start, start + n, dtype=np.uint64)
        v *= np.uint64(strides[axis])
        if axis == ndim - 1 and idx is None:
            idx = v  # a 1-D block: the index vector is the block, no second array
            break
        v = v.reshape((n,) + (1,) * (ndim - axis - 1))
        if idx is None:
            idx = xp.empty(block_shape, dtype=np.uint64)
            idx[...] = v
        else:
            idx += v
    idx += np.uint64(offset)
    return idx


def _mix(z, t, xp) -> None:
    """splitmix64's output function, in place on uint64 array z, with scratch t."""
    xp.right_shift(z, np.uint64(30), out=t)
    xp.bitwise_xor(z, t, out=z)
    xp.multiply(z, np.uint64(_M1), out=z)
    xp.right_shift(z, np.uint64(27), out=t)
    xp.bitwise_xor(z, t, out=z)
    xp.multiply(z, np.uint64(_M2), out=z)
    xp.right_shift(z, np.uint64(31), out=t)
    xp.bitwise_xor(z, t, out=z)


def _to_unit(z, t, xp, offset: int, scale: float):
    """(z >> 11 + offset) * scale as float64, written over z's own memory (z is consumed)."""
    xp.right_shift(z, np.uint64(11), out=t)
    if offset:
        xp.add(t, np.uint64(offset), out=t)
    f = z.view(np.float64)
    xp.multiply(t, np.float64(scale), out=f)
    return f


def _uniform(idx, key: int, xp):
    """Uniforms in [0, 1) for the flat indices `idx` (consumed: the result reuses its memory)."""
    # State of output number i of the stream: key + (i + 1) * gamma.
    xp.multiply(idx, np.uint64(_GAMMA), out=idx)
    xp.add(idx, np.uint64((key + _GAMMA) & _MASK), out=idx)
    t = xp.empty_like(idx)
    _mix(idx, t, xp)
    return _to_unit(idx, t, xp, 0, 2.0 ** -53)


def _normal(idx, key: int, xp):
    """Standard normals for the flat indices `idx` (consumed: the result reuses its memory)."""
    # Outputs 2i and 2i + 1 of the stream: states key + (2i + 1) gamma and key + (2i + 2) gamma.
    xp.multiply(idx, np.uint64((2 * _GAMMA) & _MASK), out=idx)
    xp.add(idx, np.uint64((key + _GAMMA) & _MASK), out=idx)
    z2 = idx + np.uint64(_GAMMA)
    t = xp.empty_like(idx)
    _mix(idx, t, xp)
    _mix(z2, t, xp)
    r = _to_unit(idx, t, xp, 1, 2.0 ** -53)  # u1 in (0, 1]: log stays finite
    xp.log(r, out=r)
    xp.multiply(r, np.float64(-2.0), out=r)
    xp.sqrt(r, out=r)
    theta = _to_unit(z2, t, xp, 0, 2.0 * math.pi * 2.0 ** -53)
    xp.cos(theta, out=theta)
    xp.multiply(r, theta, out=r)
    return r
