"""Slices with huge starts, stops and steps follow NumPy (issue 30, item 6): `x[::2**70]` of a
(4, 4) tensor is NumPy's (1, 4), and its plan reads what it keeps, not 2**70 rows per chunk
(it was a PlanError about 4294967296 TiB). Negative steps are taken too (issue 31); a zero
step is refused, by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.errors import GraphError

CLUSTER = Path(__file__).resolve().parents[2] / "graphs" / "clusters" / "8xH100.yaml"
HUGE = [2**70, -2**70, 2**63, -2**63, 2**63 - 1, 2**31, -2**31]
BOUND = st.none() | st.integers(-7, 7) | st.sampled_from(HUGE)
STEP = st.none() | st.integers(1, 5) | st.integers(-5, -1) | st.sampled_from(
    [2**70, 2**63, 2**63 - 1, 2**31, -2**70, -2**63, -2**31])
INDEX = st.tuples(st.builds(slice, BOUND, BOUND, STEP), st.builds(slice, BOUND, BOUND, STEP))


@settings(max_examples=300, deadline=None)
@given(INDEX)
def test_huge_bounds_and_steps_give_numpys_shape_and_a_plan_that_reads_little(index):
    a = np.arange(20.0).reshape(4, 5)
    t = dx.input("x", (4, 5), "float64")
    got = t[index]
    assert got.shape == a[index].shape
    plan = dx.compile(got, cluster=CLUSTER)  # no PlanError: it fits in any budget
    assert sum(n.bytes_in for n in plan.stats().nodes) <= 4 * a.nbytes


def test_the_reported_slice_plans_and_reads_one_row():
    t = dx.input("x", (4, 4), "float32")
    y = t[::2**70]
    assert y.shape == np.zeros((4, 4))[::2**70].shape == (1, 4)
    assert "TiB" not in dx.compile(y, cluster=CLUSTER).explain()


@pytest.mark.parametrize("index", [np.s_[::0], np.s_[:, 2**70:0:0]])
def test_a_zero_step_is_refused_by_name(index):
    with pytest.raises(GraphError, match="slice step cannot be zero"):
        dx.input("x", (4, 4))[index]


INDICES = [np.s_[::2**70], np.s_[2**70:], np.s_[-2**70:], np.s_[1::2**63],
           np.s_[:, 2**31::2], np.s_[-2**63:2**63:2**63 - 1, 1:-2**70], np.s_[3:2**70:2, ::3],
           np.s_[2::2**70, -1::2**70], np.s_[::-2**70], np.s_[:, 2**70:0:-1],
           np.s_[-2**63::-2, ::-2**63]]


def test_huge_slices_compute_numpys_values(client):
    a = np.arange(20.0).reshape(4, 5)
    t = dx.input("x", (4, 5), "float64")
    outs = dx.run([t[i] for i in INDICES], inputs={"x": a}, client=client, progress=False)
    for index, out in zip(INDICES, outs):
        np.testing.assert_array_equal(out, a[index])
