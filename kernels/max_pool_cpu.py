"""2x2 max pooling with stride 2 and no padding, the conv nets' usual one, compiled with numba
for a CPU: NumPy's form (`window.pool`) is three `maximum` passes over strided slices, and a
small conv net's two poolings took a fifth of its chain's time that way; here each output's
four taps are read once and compared in registers (2.5 to 3.5 times faster on blocks of 41
images of 8 x 28 x 28 and 16 x 14 x 14). The kernel reads the input as one flat run of memory
with the strides of its rows, planes and leading axis given in elements, so that each row it
reads is a contiguous slice the compiler vectorizes: a chain hands it the valid corner of a
convolution's padded grid, a strided view, which as a 4-D view of unknown strides ran scalar
(0.144 ms a block of 8 x 41 x 28 x 28 that way, 0.083 ms flat).

The taps are compared in `window.pool`'s order, each as NumPy's `maximum` compares: NaN wins
from either side, and between 0.0 and -0.0 the operand this machine's NumPy gives
(`zero_ties`, probed once); where NumPy follows no rule, NumPy pools. float32 and
float64; other poolings go to NumPy.
"""

from __future__ import annotations

import numpy as np

DTYPES = ("float32", "float64")


def takes(x, kernel, strides, pads, dilations) -> bool:
    """Whether this pooling of `x` (two leading axes, then two spatial ones, its rows
    contiguous and its other strides whole elements, none negative) runs here."""
    from deepx_flow.kernels import compiled, zero_ties
    return x.ndim == 4 and x.dtype.name in DTYPES and tuple(kernel) == (2, 2) \
        and tuple(strides) == (2, 2) and not any(pads) and tuple(dilations) == (1, 1) \
        and (x.strides[3] == x.itemsize or x.shape[3] == 1) \
        and all(s >= 0 and s % x.itemsize == 0 for s in x.strides[:3]) \
        and zero_ties.rule("maximum", x.dtype.name) is not None \
        and compiled.allowed()


def max_pool_2x2(x, out):
    """Fill `out` (contiguous: x's two leading axes, then half its spatial sizes, rounded
    down) with the 2x2 maxima of `x`."""
    return plan(x, out)(x)


def plan(x, out):
    """`max_pool_2x2` into `out` for inputs of the shape, dtype and strides of `x`, its
    strides and kernel looked up once: a function of such inputs (a chain pools every block
    of a task alike, where looking up again cost a fifth of a small pooling)."""
    from deepx_flow.kernels import zero_ties
    if out.size == 0:
        return lambda x: out
    first_wins = zero_ties.rule("maximum", x.dtype.name) == "first"
    kernel, item = _compiled()[first_wins], x.itemsize
    steps = tuple(s // item for s in x.strides[:3])
    # the memory from x's first element to its last, as one flat array
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, steps + (1,)))

    def pooled(x):
        kernel(np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(item,)), *steps,
               out)
        return out
    return pooled


_KERNELS = None


def _compiled():
    """The kernels by tie rule (False: the second operand wins a tie; True: the first),
    compiled on first use (cached on disk where numba may write)."""
    global _KERNELS
    if _KERNELS is None:
        import numba

        def compile_(f):
            try:
                return numba.njit(cache=True, nogil=True, boundscheck=False)(f)
            except RuntimeError:  # no cache locator: compiled in each process
                return numba.njit(nogil=True, boundscheck=False)(f)
        _KERNELS = {False: compile_(_second_wins_ties), True: compile_(_first_wins_ties)}
    return _KERNELS


# Two kernels rather than a flag: the comparison stays one instruction in the loop the
# compiler vectorizes. maximum(m, v) is m where m wins (or ties, for the first rule) or m is
# NaN, else v (NaN from v too). `x` is flat: element (a, b, r, c) of the 4-D input is
# x[a * lead + b * plane + r * row + c].
def _second_wins_ties(x, lead, plane, row, out):
    width = 2 * out.shape[3]
    for a in range(out.shape[0]):
        for b in range(out.shape[1]):
            for h in range(out.shape[2]):
                start = a * lead + b * plane + 2 * h * row
                top, bottom = x[start:start + width], x[start + row:start + row + width]
                pooled = out[a, b, h]
                for q in range(out.shape[3]):
                    m, v = top[2 * q], top[2 * q + 1]
                    m = m if (m > v or m != m) else v
                    v = bottom[2 * q]
                    m = m if (m > v or m != m) else v
                    v = bottom[2 * q + 1]
                    pooled[q] = m if (m > v or m != m) else v
    return out


def _first_wins_ties(x, lead, plane, row, out):
    width = 2 * out.shape[3]
    for a in range(out.shape[0]):
        for b in range(out.shape[1]):
            for h in range(out.shape[2]):
                start = a * lead + b * plane + 2 * h * row
                top, bottom = x[start:start + width], x[start + row:start + row + width]
                pooled = out[a, b, h]
                for q in range(out.shape[3]):
                    m, v = top[2 * q], top[2 * q + 1]
                    m = m if (m >= v or m != m) else v
                    v = bottom[2 * q]
                    m = m if (m >= v or m != m) else v
                    v = bottom[2 * q + 1]
                    pooled[q] = m if (m >= v or m != m) else v
    return out
