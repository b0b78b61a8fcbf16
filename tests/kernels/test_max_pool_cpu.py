"""The compiled 2x2 max pooling of stride 2 (`kernels/max_pool_cpu.py`) gives NumPy's pooling
to the bit (`window.pool`'s NumPy form, which it replaces on a CPU): NaN where NaN, signs of
zeros, infinities, odd sizes (the last row and column dropped), strided inputs; other
poolings are not taken."""

import numpy as np
from hypothesis import given, settings, strategies as st

from deepx_flow.kernels import max_pool_cpu, window

SPECIAL = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0]
ATTRS = {"kernel": (2, 2), "strides": (2, 2)}


def _numpys(x, attrs):
    saved, max_pool_cpu.DTYPES = max_pool_cpu.DTYPES, ()
    try:
        return window.pool("max_pool", x, attrs)
    finally:
        max_pool_cpu.DTYPES = saved


def _assert_same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    np.testing.assert_array_equal(np.signbit(got[~nan]), np.signbit(want[~nan]))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "float64"]))
def test_the_compiled_pooling_gives_numpys_bits(data, dtype):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)),
             data.draw(st.integers(2, 9)), data.draw(st.integers(2, 9)))
    x = rng.standard_normal(shape)
    # few distinct values, so windows tie (zeros of both signs among them) and hold NaN
    x = np.where(rng.random(shape) < 0.6, rng.choice(SPECIAL, shape), x).astype(dtype)
    view = data.draw(st.sampled_from(["contiguous", "axes swapped", "corner of a grid"]))
    if view == "axes swapped":  # a strided view, as a chain's layouts give
        x = np.ascontiguousarray(np.swapaxes(x, 0, 1)).swapaxes(0, 1)
    elif view == "corner of a grid":  # a convolution's valid corner of its padded grid
        grid = np.full(shape[:2] + (shape[2] + 3, shape[3] + 2), np.nan, dtype)
        grid[:, :, :shape[2], :shape[3]] = x
        x = grid[:, :, :shape[2], :shape[3]]
    assert max_pool_cpu.takes(x, (2, 2), (2, 2), (0,) * 4, (1, 1))
    _assert_same_bits(window.pool("max_pool", x, ATTRS), _numpys(x, ATTRS))


def test_windows_of_zeros_of_both_signs_follow_numpy():
    """Every pattern of signs of four zeros (and of three zeros beside a -1): which zero wins
    depends on the order of comparison and NumPy's rule for ties."""
    import itertools
    windows = [np.array(signs, float).reshape(2, 2) * 0.0
               for signs in itertools.product([1.0, -1.0], repeat=4)]
    windows += [np.where(np.arange(4).reshape(2, 2) == k, -1.0, w)
                for k in range(4) for w in windows]
    x = np.stack(windows)[None]
    for dtype in ("float32", "float64"):
        _assert_same_bits(window.pool("max_pool", x.astype(dtype), ATTRS),
                          _numpys(x.astype(dtype), ATTRS))


def test_inputs_whose_rows_are_not_contiguous_pool_in_numpy():
    x = np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8)
    for view in (x[..., ::2], x[..., ::-1], x[:, :, ::-1], x.swapaxes(2, 3)):
        assert not max_pool_cpu.takes(view, (2, 2), (2, 2), (0,) * 4, (1, 1))
        _assert_same_bits(window.pool("max_pool", view, ATTRS), _numpys(view, ATTRS))


def test_other_poolings_are_not_taken():
    x = np.zeros((1, 1, 6, 6), np.float32)
    assert not max_pool_cpu.takes(x, (3, 3), (2, 2), (0,) * 4, (1, 1))
    assert not max_pool_cpu.takes(x, (2, 2), (1, 1), (0,) * 4, (1, 1))
    assert not max_pool_cpu.takes(x, (2, 2), (2, 2), (1, 0, 0, 0), (1, 1))
    assert not max_pool_cpu.takes(x.astype(np.int32), (2, 2), (2, 2), (0,) * 4, (1, 1))
