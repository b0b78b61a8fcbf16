"""softmax and log_softmax along one axis: the arithmetic every engine shares.

Both subtract the maximum along the axis, exponentiate, and add the exponentials up in the
accumulator dtype (float64 for floats, as every sum here does; see `tasks`), rounding the
normalizer to the values' dtype once:

    softmax(x)     = exp(x - max) / sum(exp(x - max))
    log_softmax(x) = (x - max) - log(sum(exp(x - max)))

`normalize` computes the shared part, `finish` one of the two results from it. The softmax task
(`tasks.softmax_chunk`) and fused programs holding softmax instructions (`fused_cpu`,
`fused_gpu`) both call them, so a fused softmax gives the same bits as one run as its own
task. bfloat16 values are normalized in float32 (`value_dtype`), the result rounded once.
On NumPy every step can write into a caller's buffer: the blocked evaluator keeps them
in cache-sized, reused blocks (a fresh chunk-sized temporary costs a page-faulting allocation
on a Dask worker).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from deepx_flow.ir.dtypes import BFLOAT16, accumulator
from deepx_flow.kernels import rows_numba


class Normalized(NamedTuple):
    """What softmax and log_softmax of one value along one axis share."""

    shifted: Any    # x - max along the axis
    exps: Any       # exp(shifted)
    total: Any      # the sum of exps along the axis (dims kept), in the accumulator dtype


def value_dtype(dtype) -> np.dtype:
    """The dtype softmax computes in for an operand of `dtype`: integers become floats, and
    bfloat16 computes in float32 (its callers round the result to bfloat16 once)."""
    dtype = np.dtype(dtype)
    if dtype == BFLOAT16:
        return np.dtype(np.float32)
    return dtype if dtype.kind == "f" else np.result_type(dtype, np.float16)


def normalize(x, axis: int, xp=np, shifted=None, exps=None, wide=None) -> Normalized:
    """The shared part of softmax and log_softmax of `x` (of a float dtype) along `axis`.

    On NumPy, `shifted` and `exps` (x's shape and dtype) and `wide` (x's shape, the
    accumulator dtype, needed only when it differs from x's) are buffers to write into.
    """
    if xp is np and axis % x.ndim == x.ndim - 1 and shifted is not None and \
            rows_numba.takes(_rows(x), _rows(shifted)):  # the same bits, compiled loops
        peak = rows_numba.softmax_peak(_rows(x))
        rows_numba.per_row("sub", _rows(x), peak, _rows(shifted))
        peak = peak.reshape(x.shape[:-1] + (1,))
    else:
        peak = xp.max(x, axis=axis, keepdims=True)
        shifted = xp.subtract(x, peak, out=shifted)
    exps = xp.exp(shifted, out=exps)
    acc = accumulator(x.dtype.name)
    if xp is not np:
        total = xp.sum(exps, axis=axis, keepdims=True, dtype=acc)
    elif acc is None or np.dtype(acc) == exps.dtype:
        total = exps.sum(axis=axis, keepdims=True)
    elif wide is None:  # no chunk-sized float64 copy where the caller gives no buffer
        total = exps.sum(axis=axis, keepdims=True, dtype=acc)
    else:
        # NumPy has no loop adding float32 into float64: casting into a block of its own and
        # summing there is 1.5x faster than sum(dtype=float64) (see tasks._sum).
        np.copyto(wide, exps, casting="unsafe")
        total = wide.sum(axis=axis, keepdims=True)
    return Normalized(shifted, exps, total)


def finish(op: str, stats: Normalized, xp=np, out=None):
    """softmax or log_softmax from `normalize`'s result, into `out` when given (which may be
    `stats.exps` for softmax or `stats.shifted` for log_softmax)."""
    dtype = stats.exps.dtype
    if op not in ("softmax", "log_softmax"):
        raise ValueError(f"not a whole-axis operator: {op}")
    x = stats.exps if op == "softmax" else stats.shifted
    value = stats.total.astype(dtype) if op == "softmax" else xp.log(stats.total).astype(dtype)
    if xp is np and out is not None and x.ndim and value.shape == x.shape[:-1] + (1,) and \
            out.shape == x.shape and rows_numba.takes(_rows(x), _rows(out), _rows(value)):
        rows_numba.per_row("div" if op == "softmax" else "sub", _rows(x), _rows(value),
                           _rows(out))
        return out
    return (xp.divide if op == "softmax" else xp.subtract)(x, value, out=out)


def _rows(a):
    """`a` as rows of its last axis (a view where `a` is C-contiguous; `takes` says)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim and a.flags.c_contiguous else a
