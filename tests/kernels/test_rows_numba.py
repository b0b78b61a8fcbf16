"""softmax and log_softmax along the last axis with their row maxima, shifts and divisions
compiled (`kernels/rows_numba.py`) give NumPy's results to the bit: rows with a NaN, an
infinity, a maximum of 0.0 or -0.0 included, float32 and float64, 2-D and 3-D; and the
compiled loops are what run where they can."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deepx_flow.kernels import compiled, rows_numba, softmax, tasks
from tests.kernels.test_fused_numba import assert_same_bits

ROW_SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3e38, -3e38]


def through(op, x, allowed: bool):
    """softmax.normalize and finish on NumPy buffers, as the blocked evaluator calls them,
    with compiled kernels allowed or not."""
    shifted, exps = np.empty_like(x), np.empty_like(x)
    wide = np.empty(x.shape, np.float64) if x.dtype != np.float64 else None
    with mock.patch.object(compiled, "allowed", lambda: allowed), \
            np.errstate(all="ignore"):
        stats = softmax.normalize(x, x.ndim - 1, np, shifted=shifted, exps=exps, wide=wide)
        return softmax.finish(op, stats, np, out=np.empty_like(x))


@st.composite
def blocks(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    shape = draw(st.sampled_from([(64, 256), (7, 33), (3, 5, 40), (16, 1), (2, 17)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = (rng.standard_normal(shape) * draw(st.sampled_from([1.0, 30.0]))).astype(dtype)
    rows = x.reshape(-1, shape[-1])
    for r in range(rows.shape[0]):
        kind = draw(st.sampled_from(["plain", "special", "zero max", "all equal"]))
        if kind == "special":
            rows[r, rng.integers(shape[-1])] = draw(st.sampled_from(ROW_SPECIAL))
        elif kind == "zero max":
            rows[r] = -np.abs(rows[r])
            rows[r, rng.integers(shape[-1])] = draw(st.sampled_from([0.0, -0.0]))
        elif kind == "all equal":
            rows[r] = draw(st.sampled_from([0.0, -0.0, 2.5, -np.inf]))
    return x


@settings(max_examples=150, deadline=None)
@given(x=blocks(), op=st.sampled_from(["softmax", "log_softmax"]))
def test_compiled_steps_give_numpys_bits(x, op):
    assert_same_bits(through(op, x, True), through(op, x, False))


def test_the_compiled_loops_run_where_they_can():
    x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    with mock.patch.object(rows_numba, "per_row", wraps=rows_numba.per_row) as per_row:
        through("softmax", x, True)
        through("log_softmax", x, True)
    assert [c.args[0] for c in per_row.call_args_list] == ["sub", "div", "sub", "sub"]


@pytest.mark.parametrize("shape", [(300, 256), (2, 1000, 64)])
def test_a_softmax_task_in_blocks_of_rows_matches_float64(shape):
    x = (np.random.default_rng(1).standard_normal(shape) * 5).astype(np.float32)
    x.reshape(-1, shape[-1])[3, :] = -np.abs(x.reshape(-1, shape[-1])[3, :])
    x.reshape(-1, shape[-1])[3, 7] = 0.0  # a row whose maximum is zero
    got = tasks.softmax_chunk("softmax", -1, ((),), x)
    wide = x.astype(np.float64)
    e = np.exp(wide - wide.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=2e-6, atol=1e-30)
    with mock.patch.object(compiled, "allowed", lambda: False):
        assert_same_bits(got, tasks.softmax_chunk("softmax", -1, ((),), x))
