"""Which operand NumPy's `maximum` and `minimum` give when they compare 0.0 with -0.0, the
one case where the two operands are equal but not the same bits.

IEEE 754 leaves it open, and NumPy's loops differ between versions and machines (NumPy 2.4
on an AVX2 EPYC gives the second operand, so `relu(-0.0)`, `maximum(-0.0, 0.0)`, is 0.0).
Every kernel that computes a maximum or minimum its own way (numexpr formulas, numba loops,
the compiled pooling) asks here, so its zeros carry the signs NumPy's would; where NumPy
follows neither rule, those kernels leave the operation to NumPy.
"""

from __future__ import annotations

import numpy as np

DTYPES = ("float16", "float32", "float64")


def _probe() -> dict:
    """(op, dtype) -> "first" or "second" (the operand NumPy gives between 0.0 and -0.0,
    the same in both orders), or None where it follows neither; relu is maximum(x, 0)."""
    ties = {}
    for dtype in DTYPES:
        zero, negative = np.zeros(64, dtype), np.full(64, -0.0, dtype)  # SIMD loops too
        for op in ("maximum", "minimum"):
            ufunc = getattr(np, op)
            a, b = np.signbit(ufunc(negative, zero)), np.signbit(ufunc(zero, negative))
            rule = "first" if a.all() and not b.any() else \
                "second" if b.all() and not a.any() else None
            ties[(op, dtype)] = rule
        ties[("relu", dtype)] = ties[("maximum", dtype)]
    return ties


TIES = _probe()  # probed once per process


def rule(op: str, dtype: str) -> str | None:
    """"first" or "second" for `op` (maximum, minimum or relu) on `dtype`; None where NumPy
    follows neither rule or the dtype is not a float probed here."""
    return TIES.get((op, dtype))
