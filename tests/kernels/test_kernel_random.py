"""Counter-based random chunks: independent of the chunk grid, well distributed, in range."""

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels import random as rnd
from deepx_flow.kernels.random import random_chunk

OPS = ("random_normal", "random_uniform")


def whole(op, seed, shape, dtype="float64", params=None):
    return random_chunk(op, seed, params or {}, shape, tuple((0, s) for s in shape), dtype)


def test_splitmix64_matches_the_reference_sequence():
    # splitmix64.c (Vigna) seeded with 1234567: the state advances by gamma before mixing
    state, outs = 1234567, []
    for _ in range(5):
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        outs.append(rnd.mix64(state))
    assert outs == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                    4593380528125082431, 16408922859458223821]


def test_array_code_matches_the_scalar_definition():
    n = 50
    got = random_chunk("random_uniform", 42, {}, (n,), ((0, n),), "float64")
    key = rnd.stream_key("random_uniform", 42)
    gamma = 0x9E3779B97F4A7C15
    want = [(rnd.mix64(key + (i + 1) * gamma) >> 11) * 2.0 ** -53 for i in range(n)]
    np.testing.assert_array_equal(got, want)


@st.composite
def splits(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    cuts = []
    for s in shape:
        inner = sorted(draw(st.lists(st.integers(0, s), max_size=3)))
        cuts.append([0] + inner + [s])
    return shape, cuts


@settings(max_examples=120, deadline=None)
@given(case=splits(), op=st.sampled_from(OPS), seed=st.integers(0, 2**63 - 1),
       dtype=st.sampled_from(["float16", "float32", "float64"]))
def test_any_split_into_regions_reproduces_the_whole(case, op, seed, dtype):
    shape, cuts = case
    full = whole(op, seed, shape, dtype)
    assembled = np.full(shape, np.nan, dtype=dtype)
    for idx in np.ndindex(*[len(c) - 1 for c in cuts]):
        region = tuple((cuts[a][i], cuts[a][i + 1]) for a, i in enumerate(idx))
        part = random_chunk(op, seed, {}, shape, region, dtype)
        assert part.shape == tuple(b - a for a, b in region) and part.dtype == np.dtype(dtype)
        assembled[tuple(slice(a, b) for a, b in region)] = part
    np.testing.assert_array_equal(assembled, full)  # bit for bit, NaN-free


@pytest.mark.parametrize("op", OPS)
def test_values_depend_on_the_flat_index_only(op, monkeypatch):
    flat = whole(op, 7, (240,))
    for shape in ((6, 40), (2, 3, 4, 10), (240, 1)):
        np.testing.assert_array_equal(whole(op, 7, shape).ravel(), flat)
    # block boundaries inside a chunk do not matter either
    monkeypatch.setattr(rnd, "BLOCK_ELEMENTS", 7)
    np.testing.assert_array_equal(whole(op, 7, (6, 40)).ravel(), flat)


def _ks(sample, cdf):
    """Kolmogorov-Smirnov distance of a sample from a continuous CDF."""
    x = np.sort(sample)
    f = cdf(x)
    n = len(x)
    return max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))


_erf = np.vectorize(math.erf)
N = 200_000
KS_LIMIT = 1.95 / math.sqrt(N)  # the 0.1% critical value


@pytest.mark.parametrize("seed", [0, 1, 2**40 + 3])
def test_normal_statistics(seed):
    z = whole("random_normal", seed, (N,))
    assert abs(z.mean()) < 5 / math.sqrt(N)
    assert abs(z.std() - 1) < 5 / math.sqrt(2 * N)
    assert _ks(z, lambda x: 0.5 * (1 + _erf(x / math.sqrt(2)))) < KS_LIMIT
    # tails: P(|z| > 3) = 0.0027
    assert abs(np.mean(np.abs(z) > 3) - 0.0027) < 5 * math.sqrt(0.0027 / N)


@pytest.mark.parametrize("seed", [0, 5, 2**62])
def test_uniform_statistics(seed):
    u = whole("random_uniform", seed, (N,))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / N)
    assert abs(u.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / N)
    assert _ks(u, lambda x: x) < KS_LIMIT
    # neighbours are not correlated
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / math.sqrt(N)


def test_parameters_shift_and_scale():
    z = whole("random_normal", 3, (N,), "float32", {"mean": 3.0, "std": 2.0})
    assert z.dtype == np.float32
    assert abs(z.mean() - 3) < 10 / math.sqrt(N) and abs(z.std() - 2) < 10 / math.sqrt(2 * N)
    u = whole("random_uniform", 3, (N,), "float32", {"low": -5.0, "high": -1.0})
    assert -5 <= u.min() and u.max() < -1 and abs(u.mean() + 3) < 0.05


def test_different_seeds_and_operators_give_unrelated_values():
    a, b = whole("random_uniform", 0, (N,)), whole("random_uniform", 1, (N,))
    assert np.mean(a == b) < 1e-3
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(N)
    n0 = whole("random_normal", 0, (N,))
    assert abs(np.corrcoef(n0, a)[0, 1]) < 5 / math.sqrt(N)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_uniform_stays_strictly_below_high_after_rounding(dtype):
    t = np.dtype(dtype).type
    ulp = float(np.spacing(t(1.0)))
    low, high = 1.0, 1.0 + 4 * ulp  # four representable values in [low, high)
    u = whole("random_uniform", 9, (20_000,), dtype, {"low": low, "high": high})
    assert u.min() >= low and u.max() < high
    # rounding alone would have reached high for 1/8 of the values; the clamp leaves them on
    # the largest value below high, which so holds 1/4 + 1/8 of them
    assert abs(np.mean(u == t(1.0 + 3 * ulp)) - 0.375) < 0.03
    # an unrepresentable low: values never fall below it
    u = whole("random_uniform", 9, (20_000,), "float32", {"low": 0.1, "high": 0.2})
    assert u.min() >= 0.1 and u.max() < 0.2


def test_bad_requests_raise():
    with pytest.raises(ExecutionError, match="unknown random operator"):
        random_chunk("random_poisson", 0, {}, (3,), ((0, 3),), "float32")
    with pytest.raises(ExecutionError, match="floating-point"):
        random_chunk("random_normal", 0, {}, (3,), ((0, 3),), "int32")
    with pytest.raises(ExecutionError, match="low < high"):
        random_chunk("random_uniform", 0, {"low": 1.0, "high": 1.0}, (3,), ((0, 3),),
                     "float32")
    with pytest.raises(ExecutionError, match="no float16 value lies in"):
        random_chunk("random_uniform", 0, {"low": 1.0001, "high": 1.0002}, (3,), ((0, 3),),
                     "float16")
    with pytest.raises(ExecutionError, match="std >= 0"):
        random_chunk("random_normal", 0, {"std": -1.0}, (3,), ((0, 3),), "float32")
    with pytest.raises(ExecutionError, match="not inside shape"):
        random_chunk("random_normal", 0, {}, (3, 4), ((0, 3), (2, 5)), "float32")


def test_empty_and_zero_dimensional_regions():
    assert random_chunk("random_normal", 0, {}, (3, 0), ((0, 3), (0, 0)), "float32").shape \
        == (3, 0)
    z = random_chunk("random_normal", 0, {}, (), (), "float64")
    assert z.shape == () and z == whole("random_normal", 0, (1,))[0]


SCRATCH_PROBE = """
import sys, tracemalloc
from deepx_flow.kernels.random import random_chunk
op, n = sys.argv[1], 2_000_000
random_chunk(op, 0, {}, (n,), ((0, n),), "float32")  # warm up
tracemalloc.start()
out = random_chunk(op, 0, {}, (1000, 2000), ((0, 1000), (0, 2000)), "float32")
print(tracemalloc.get_traced_memory()[1] - out.nbytes)
"""


@pytest.mark.parametrize("op", OPS)
def test_scratch_memory_is_bounded_by_the_block(op):
    # A fresh process: tracemalloc counts every thread, and the test session's in-process
    # Dask workers allocate in the background.
    done = subprocess.run([sys.executable, "-c", SCRATCH_PROBE, op],
                          capture_output=True, text=True, check=True, timeout=120)
    scratch = int(done.stdout.split()[-1])
    assert scratch <= rnd.SCRATCH_BYTES_PER_ELEMENT[op] * rnd.BLOCK_ELEMENTS + 64 * 1024


def test_unknown_parameters_are_named():
    with pytest.raises(ExecutionError, match="takes parameters mean, std, not sd"):
        random_chunk("random_normal", 0, {"sd": 2.0}, (3,), ((0, 3),), "float32")
