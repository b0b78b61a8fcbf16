"""The compiled depthwise convolution (`kernels/depthwise_cpu.py`): both loop orders give
the same numbers, equal to NumPy's loop reference in float64 (exactly where the sums are
exact), on every stride, dilation, padding and layout the chains use; float16 goes through
float32 as before."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deepx_flow.kernels import depthwise_cpu, window
from tests.kernels.test_window import ref_conv


def _run(x, w, strides, pads, dilations, channels_first, out_channels_first):
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "groups": x.shape[1]}
    source = np.ascontiguousarray(np.moveaxis(x, 0, 1)) if channels_first else x
    got = window.conv(source, w, attrs, {}, channels_first, out_channels_first)
    return np.moveaxis(got, 0, 1) if out_channels_first else got


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5), c=st.integers(2, 12), h=st.integers(1, 11), wd=st.integers(1, 11),
       k=st.sampled_from([(1, 1), (3, 3), (5, 5), (3, 1), (2, 3)]), s=st.integers(1, 3),
       d=st.integers(1, 2), pads=st.tuples(*[st.integers(0, 3)] * 4),
       layouts=st.tuples(st.booleans(),
                                                                     st.booleans()),
       seed=st.integers(0, 2**16))
def test_both_loop_orders_equal_numpys_reference(n, c, h, wd, k, s, d, pads, layouts, seed):
    """Padding on any side (as wide as a tap's reach or wider: rows and columns of padding
    only) is read as zeros without a padded copy."""
    if (h + pads[0] + pads[2] - d * (k[0] - 1)) < 1 or \
            (wd + pads[1] + pads[3] - d * (k[1] - 1)) < 1:
        return  # no output position
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd))
    w = rng.standard_normal((c, 1) + k)
    strides, dilations = (s, s), (d, d)
    want = ref_conv(x, w, strides, pads, dilations, c)
    results = []
    for wide in (0, 10**9):  # every row by rows, then every row by channels
        saved = depthwise_cpu.WIDE_ROWS
        depthwise_cpu.WIDE_ROWS = wide
        try:
            results.append(_run(x, w, strides, pads, dilations, *layouts))
        finally:
            depthwise_cpu.WIDE_ROWS = saved
    np.testing.assert_array_equal(results[0], results[1])
    scale = ref_conv(np.abs(x), np.abs(w), strides, pads, dilations, c)
    np.testing.assert_allclose(results[0], want, rtol=0, atol=1e-13 * scale.max() + 1e-300)
    # float32: each tap rounded as NumPy rounds it, the sum of the rounded terms
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    got32 = _run(x32, w32, strides, pads, dilations, *layouts)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref_conv(x32.astype(np.float64), w32.astype(np.float64),
                                               strides, pads, dilations, c),
                               rtol=0, atol=1e-5 * scale.max() + 1e-30)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_small_integers_sum_exactly(dtype):
    """Integer-valued inputs: every product and sum is exact, so the result is the
    reference's to the bit, by both loop orders."""
    rng = np.random.default_rng(1)
    x = rng.integers(-8, 9, (3, 40, 17, 15)).astype(dtype)
    w = rng.integers(-4, 5, (40, 1, 3, 3)).astype(dtype)
    want = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), (1,) * 4, (1, 1), 40)
    for wide in (0, 10**9):
        saved, depthwise_cpu.WIDE_ROWS = depthwise_cpu.WIDE_ROWS, wide
        try:
            got = _run(x, w, (1, 1), (1,) * 4, (1, 1), False, False)
        finally:
            depthwise_cpu.WIDE_ROWS = saved
        np.testing.assert_array_equal(got, want.astype(dtype))


def test_float16_adds_up_in_float32_and_rounds_once():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 9, 9)).astype(np.float16)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float16)
    got = _run(x, w, (2, 2), (1,) * 4, (1, 1), False, False)
    assert got.dtype == np.float16
    wide = _run(x.astype(np.float32), w.astype(np.float32), (2, 2), (1,) * 4, (1, 1), False,
                False)
    np.testing.assert_array_equal(got, wide.astype(np.float16))


def test_numpys_loop_and_the_compiled_kernels_give_the_same_bits():
    """Against `window._direct`'s NumPy loop itself (the compiled path turned off), on
    non-contiguous blocks, both layouts, negative zeros included."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 20, 30, 29)).astype(np.float32)[::2, :, 1:, :]  # a view
    x[0, 0], x[0, 1] = -0.0, 0.0
    w = rng.standard_normal((20, 1, 3, 3)).astype(np.float32)
    w[0] = np.abs(w[0])  # -0.0 times positive taps: a sum of negative zeros
    w[1] = -np.abs(w[1])  # 0.0 times negative taps, the padding's too: negative zeros
    for strides, pads, layouts in itertools.product(
            ((1, 1), (2, 2), (3, 1)), ((1, 1, 1, 1), (0, 2, 3, 1), (4, 0, 0, 4)),
            ((False, False), (True, True), (False, True))):
        saved, depthwise_cpu.DTYPES = depthwise_cpu.DTYPES, ()
        try:
            want = _run(x, w, strides, pads, (1, 1), *layouts)
        finally:
            depthwise_cpu.DTYPES = saved
        for wide in (0, 10**9):  # by rows, by channels
            saved, depthwise_cpu.WIDE_ROWS = depthwise_cpu.WIDE_ROWS, wide
            try:
                got = _run(x, w, strides, pads, (1, 1), *layouts)
            finally:
                depthwise_cpu.WIDE_ROWS = saved
            np.testing.assert_array_equal(got, want)
            assert np.array_equal(np.signbit(got), np.signbit(want))


def test_without_a_writable_cache_folder_the_kernels_compile_in_the_process():
    """Where numba finds no writable cache folder (a read-only install, an unwritable home:
    numba says "no locator available" when the kernel is made) the kernels are compiled in
    the process rather than failing. The tests run as root, who can write anywhere, so numba
    is left with no cache locator to try, in a process of its own."""
    import subprocess
    import sys
    script = ("import numpy as np\n"
              "import numba.core.caching as caching\n"
              "caching.CacheImpl._locator_classes = []  # no folder numba may cache in\n"
              "from deepx_flow.kernels import depthwise_cpu as d\n"
              "x = np.ones((1, 2, 5, 5), np.float32); w = np.ones((2, 1, 3, 3), np.float32)\n"
              "out = np.empty((1, 2, 3, 3), np.float32)\n"
              "d.depthwise(x, w, (1, 1), (1, 1), False, False, out)\n"
              "assert (out == 9).all(), out\n"
              "assert not d._KERNELS[0]._cache.__class__.__name__ == 'FunctionCache'\n"
              "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]
