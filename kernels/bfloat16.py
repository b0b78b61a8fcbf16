"""bfloat16 on the CPU: exact widening, and rounding to bfloat16 exactly once.

bfloat16 is a storage type here (`ir.dtypes`): NumPy holds it through `ml_dtypes`, and every
operator computes on it in float32 (or in the wider dtype its result has) and rounds its
result to bfloat16 once, to nearest, ties to even. Widening bfloat16 to float32 is exact, so
an operator on bfloat16 operands gives what NumPy with ml_dtypes gives op by op.

Rounding. ml_dtypes converts float32 (and anything float32 holds exactly: float16, bool, 8-
and 16-bit integers) to bfloat16 correctly. It converts float64 by way of float32, rounding
twice, which is off by one bfloat16 step for values just past a tie (1 + 2**-8 + 2**-30 gives
1 instead of 1 + 2**-7). So wider values (float64, 32- and 64-bit integers) go through
float32 rounded to odd here: truncated toward zero, its last bit set where anything was cut
off. float32 keeps 16 more bits than bfloat16, so the second rounding then sees the cut-off
part as what it was (below, at or above half a step) and rounds once, correctly (Boldo and
Melquiond, "When double rounding is odd", 2005). Sums and means, which add up in float64, and
casts from float64 round through here.

Only NumPy arrays: CuPy has no bfloat16, and the planner refuses bfloat16 on GPU workers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepx_flow.ir.dtypes import BFLOAT16

# Sources ml_dtypes rounds to bfloat16 correctly: float32 holds all their values exactly.
_EXACT_IN_FLOAT32 = frozenset(np.dtype(d) for d in (
    "bool", "int8", "int16", "uint8", "uint16", "float16", "float32"))


def is_bfloat16(x: Any) -> bool:
    """Whether `x` (an array, a dtype or a dtype name) is bfloat16."""
    dtype = getattr(x, "dtype", x)
    try:
        return np.dtype(dtype) == BFLOAT16
    except TypeError:
        return False


def widen(x: Any) -> Any:
    """`x` as float32 when it is bfloat16 (exact), else `x` itself."""
    return x.astype(np.float32) if is_bfloat16(x) else x


def to_bfloat16(x: Any, out: np.ndarray | None = None) -> np.ndarray:
    """`x` rounded to bfloat16 once: to nearest, ties to even; past the largest finite
    bfloat16 (by half a step or more) to infinity; NaN stays NaN.

    Parameters
    ----------
    x
        A NumPy array (or scalar) of a bool, integer or float dtype.
    out
        A bfloat16 array of x's (broadcast) shape to write into, if given.
    """
    x = np.asarray(x)
    if x.dtype == BFLOAT16:
        narrow = x
    elif x.dtype in _EXACT_IN_FLOAT32:
        narrow = x
    else:
        narrow = _float32_round_to_odd(x)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are values here
        if out is None:
            return narrow.astype(BFLOAT16)
        np.copyto(out, narrow, casting="unsafe")
    return out


def astype(x: Any, dtype) -> Any:
    """`x.astype(dtype)`, rounding correctly where `dtype` is bfloat16 (a new array, or `x`
    itself where it has that dtype already)."""
    if np.dtype(dtype) == BFLOAT16:
        return x if is_bfloat16(x) else to_bfloat16(x)
    return x if x.dtype == dtype else x.astype(dtype)


def copyto(out: np.ndarray, x: Any) -> np.ndarray:
    """`np.copyto(out, x, casting="unsafe")`, rounding correctly where `out` is bfloat16."""
    if out.dtype == BFLOAT16:
        return to_bfloat16(x, out=out)
    np.copyto(out, x, casting="unsafe")
    return out


def _float32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float32 values of `x` (float64 or an integer dtype) rounded to odd: each is the float32
    next to x toward zero, with its last bit set when x lies strictly between two float32s
    (x itself when float32 holds it). Past float32's range: its largest finite value."""
    error = None
    if x.dtype.kind == "f":
        high = x.astype(np.float64, copy=False)
    elif x.dtype.kind in "iu" and x.dtype.itemsize == 8:
        # float64 holds 53 bits, an int64 up to 63: split the value into a high part and
        # the 32 bits under it (both exact in float64), add them in float64 and keep what the
        # sum lost (exact: Fast2Sum, the high part is the larger one).
        top = (x >> 32) << 32
        top_f, low_f = top.astype(np.float64), (x - top).astype(np.float64)
        high = top_f + low_f
        error = low_f - (high - top_f)
    else:  # 32-bit integers: exact in float64
        high = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        near = high.astype(np.float32)  # to nearest: off by less than one float32 step
        rest = high - near.astype(np.float64)  # exact; +-inf where float32 overflowed
    inexact = (rest != 0) & ~np.isnan(rest)  # NaN: x was NaN, or an infinity (exact)
    below = rest < 0  # the value lies below `near`
    if error is not None:
        inexact |= error != 0
        below |= (rest == 0) & (error < 0)
    above = inexact & ~below
    away = ((near > 0) & below) | ((near < 0) & above)  # rounded away from zero
    bits = near.view(np.uint32)
    bits -= away.astype(np.uint32)  # one step back toward zero (sign and magnitude)
    bits |= inexact.astype(np.uint32)
    return near
