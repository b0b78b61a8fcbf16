"""Reduction and softmax kernels: sums add up in float64, blocks of rows change no result.

`reduce_partial` walks a NumPy chunk in blocks of rows (its prologue computed one block at a
time), so the tests shrink the block to a few elements to get many blocks, ragged ones, and
blocks along an axis that is reduced or kept.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deepx_flow.kernels import tasks
from tests.helpers import (assert_sums_close, assert_within_ulps, exact_sum,
                           rows_of_infinities)

# (x - in1) * (x - in1): a prologue reading a broadcast operand, as a variance's does.
SQUARED_DEVIATION = (("sub", (("in", 0), ("in", 1)), "float32"),
                     ("mul", (("t", 0), ("t", 0)), "float32"))


@st.composite
def reductions(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    axes = tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), min_size=1))))
    return shape, axes


@settings(max_examples=60, deadline=None)
@given(case=reductions(), op=st.sampled_from(["sum", "mean", "max", "min"]),
       prologue=st.booleans(), block=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_blocks_of_rows_give_the_one_block_result(case, op, prologue, block, seed):
    shape, axes = case
    rng = np.random.default_rng(seed)
    x = (1e4 + rng.random(shape)).astype(np.float32)
    center = (1e4 + np.asarray(rng.random(shape[1:]))).astype(np.float32)  # broadcasts on axis 0
    acc = "float64" if op in ("sum", "mean") else None
    args = (SQUARED_DEVIATION, axes, acc, shape, ((), ()), x, center) if prologue else \
        (None, axes, acc, shape, ((),), x)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tasks, "REDUCE_BLOCK_ELEMENTS", block)
        got = tasks.reduce_partial(op, *args)
    values = (x - center) * (x - center) if prologue else x
    if op in ("max", "min"):
        expected = getattr(np, op)(values, axis=axes, keepdims=True)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.float32
    else:
        assert got.dtype == np.float64 and got.shape == expected_shape(shape, axes)
        assert_sums_close(got, exact_sum(values, axes, keepdims=True),
                          exact_sum(np.abs(values), axes, keepdims=True), rtol=1e-13)


@pytest.mark.parametrize("block", [20, 40, 1000])
def test_a_sum_of_negative_zeros_in_blocks_is_positive_zero_as_numpys(block):
    """A block whose reduced axes are 1 long is added as it is; the sum still starts from 0,
    as NumPy's add.reduce does, so -0.0 terms alone sum to +0.0 at any block size."""
    x = np.full((3, 4, 5), -0.0, dtype=np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tasks, "REDUCE_BLOCK_ELEMENTS", block)
        got = tasks.reduce_partial("sum", None, (0,), "float64", x.shape, ((),), x)
    want = np.sum(x.astype(np.float64), axis=0, keepdims=True)
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got).any() and not np.signbit(want).any()


def expected_shape(shape, axes):
    return tuple(1 if a in axes else s for a, s in enumerate(shape))


@pytest.mark.parametrize("dtype, rows, offset", [("float32", 100_000, 1.0),
                                                 ("float16", 20_000, 0.0)])
def test_a_tall_column_sum_is_the_float64_sum_rounded_once(dtype, rows, offset):
    # Added up row after row in their own dtype, such sums drift by many ulps.
    x = (offset + np.random.default_rng(0).random((rows, 3))).astype(dtype)
    partial = tasks.reduce_partial("sum", None, (0,), "float64", x.shape, ((),), x)
    assert partial.dtype == np.float64
    got = tasks.finish_reduce("sum", (0,), False, x.shape[0], dtype, partial)
    assert got.dtype == dtype
    assert_within_ulps(got, exact_sum(x, 0), 0.5)  # float64 adds these exactly


def test_partial_sums_combine_in_float64_and_round_once_at_the_end():
    # float32 partials of +1e8 and -1e8 around small values: float32 adds would lose them.
    parts = [np.array([[1e8]]), np.array([[0.25]]), np.array([[-1e8]]), np.array([[0.5]])]
    got = tasks.finish_reduce("mean", (0,), True, 4, "float32", *parts)
    assert got.dtype == np.float32 and got[0, 0] == np.float32(0.75 / 4)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_normalizer_adds_up_in_float64(op):
    # Along axis 0 of a tall chunk, a float32 normalizer is summed row after row.
    x = np.random.default_rng(1).random((200_000, 2), dtype=np.float32)
    got = tasks.softmax_chunk(op, 0, ((),), x)
    assert got.dtype == np.float32
    shifted = x.astype(np.float64) - x.max(axis=0)
    total = exact_sum(np.exp(shifted), 0, keepdims=True)
    expected = shifted - np.log(total) if op == "log_softmax" else np.exp(shifted) / total
    # exp and the subtraction or division round in float32 too: a few ulps.
    assert_within_ulps(got, expected, 4)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
       op=st.sampled_from(["softmax", "log_softmax"]), block=st.integers(1, 40),
       dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**32 - 1))
def test_softmax_along_the_last_axis_in_blocks_of_rows_is_the_whole_chunk_result(
        shape, op, block, dtype, seed):
    # Over REDUCE_BLOCK_ELEMENTS elements, softmax along the last axis runs a block of rows
    # at a time; the arithmetic is the same, so the result is the same to the bit.
    x = (np.random.default_rng(seed).standard_normal(shape) * 20).astype(dtype)
    whole = tasks.softmax_chunk(op, len(shape) - 1, ((),), x)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tasks, "REDUCE_BLOCK_ELEMENTS", block)
        blocks = tasks.softmax_chunk(op, -1, ((),), x)
    assert blocks.dtype == whole.dtype == np.dtype(dtype) and blocks.shape == shape
    np.testing.assert_array_equal(blocks, whole)
    reference = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    total = np.exp(reference).sum(axis=-1, keepdims=True)
    reference = reference - np.log(total) if op == "log_softmax" \
        else np.exp(reference) / total
    np.testing.assert_allclose(blocks, reference, rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-6 if dtype == "float32" else 1e-13)


def test_softmax_rows_of_infinities_give_what_the_whole_chunk_gives():
    x = rows_of_infinities()
    for op in ("softmax", "log_softmax"):
        with np.errstate(invalid="ignore"):
            whole = tasks.softmax_chunk(op, 1, ((),), x)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tasks, "REDUCE_BLOCK_ELEMENTS", 5)
            blocks = tasks.softmax_chunk(op, 1, ((),), x)
        np.testing.assert_array_equal(blocks, whole)
