"""A row's maximum, and a value per row subtracted from it or divided into it, compiled.

softmax and log_softmax along the last axis (`kernels/softmax.py`) take a row's maximum, then
subtract it from the row, divide the exponentials by the row's sum, subtract the log of that
sum: NumPy does each as a loop per row, and on rows of 256 values a block of 256 such rows
took 45, 38, 27 and 32 us, against 8 us for a multiplication of two whole blocks. Here each
is one compiled loop over the block.

Every one of them is exact in IEEE arithmetic, so softmax's results are NumPy's to the bit
(a row with a NaN is NaN throughout, as with NumPy). Which of 0.0 and -0.0 NumPy's maximum
gives where they tie is not its promise (it changes with its SIMD loops), and the sign of a
shifted zero follows from it, so a block with a row whose maximum is zero takes NumPy's
maximum. The functions are plain numba functions, compiled once per process for each dtype.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.kernels import compiled

DTYPES = ("float32", "float64")
LANES = 16
_NUMPY_DTYPES = frozenset(np.dtype(d) for d in DTYPES)
_jitted: dict = {}


def takes(*arrays) -> bool:
    """Whether these (2-D, C-contiguous, one float dtype) are arrays this module works on,
    in this process (`compiled.allowed`)."""
    dtype = arrays[0].dtype
    for a in arrays:  # per block of a softmax: kept to attribute reads (dtype.name is slow)
        if not isinstance(a, np.ndarray) or a.ndim != 2 or not a.flags.c_contiguous or \
                a.dtype != dtype:
            return False
    return dtype in _NUMPY_DTYPES and compiled.allowed()


def softmax_peak(x: np.ndarray) -> np.ndarray:
    """What softmax subtracts from every row of `x` (2-D, `takes`), as an (n, 1) array: its
    maximum, NumPy's own where some row's is zero. A row holding a NaN gets a NaN or the
    largest of its other values: either way its shifted values hold the NaN, and so its sum
    and its softmax and log_softmax are NaN throughout, as with NumPy's maximum."""
    peak = np.empty((x.shape[0], 1), x.dtype)
    if _kernel("row_max")(x, peak[:, 0]):
        np.max(x, axis=1, keepdims=True, out=peak)
    return peak


def per_row(op: str, x: np.ndarray, values: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`x - values` or `x / values` ("sub", "div") into `out`, `values` one per row ((n, 1),
    x's dtype); `out` may be `x`."""
    _kernel(op)(x, values.reshape(-1), out)
    return out


def _kernel(name: str):
    found = _jitted.get(name)
    if found is None:
        import numba
        found = _jitted[name] = numba.njit(nogil=True, boundscheck=False,
                                           error_model="numpy")(_SOURCES[name])
    return found


def _row_max(x, peak):
    """Each row's maximum into `peak`, by LANES running maxima a row (which the compiler
    turns into vector instructions; a running maximum that minds NaN, or NaNs counted
    alongside, it does not); whether a row's maximum is zero."""
    n = x.shape[1]
    whole = n - n % LANES
    lanes = np.empty(LANES, x.dtype)
    zero = False
    for r in range(x.shape[0]):
        row = x[r]
        for k in range(LANES):
            lanes[k] = row[0]
        for c0 in range(0, whole, LANES):
            for k in range(LANES):
                v = row[c0 + k]
                lanes[k] = v if v > lanes[k] else lanes[k]
        m = lanes[0]
        for k in range(1, LANES):
            m = lanes[k] if lanes[k] > m else m
        for c in range(whole, n):
            v = row[c]
            m = v if v > m else m
        peak[r] = m
        zero = zero or m == 0
    return zero


def _sub(x, values, out):
    for r in range(x.shape[0]):
        v = values[r]
        for c in range(x.shape[1]):
            out[r, c] = x[r, c] - v


def _div(x, values, out):
    for r in range(x.shape[0]):
        v = values[r]
        for c in range(x.shape[1]):
            out[r, c] = x[r, c] / v


_SOURCES = {"row_max": _row_max, "sub": _sub, "div": _div}
