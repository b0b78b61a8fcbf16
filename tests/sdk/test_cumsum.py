"""`dx.cumsum`, the scan operator, against NumPy in float64: any shape, axis (negative ones
included), `exclusive` and `reverse`, every dtype, under budgets that split the scanned axis
into many chunks (the result must not depend on the chunk grid or the number of workers);
its plan is linear in the chunks; gradients are the reversed scan of the cotangent and equal
central finite differences; bad arguments are GraphErrors naming what is wrong.

Tolerances: a float result is compared with the float64 prefix sums of its terms, within a
relative error of the sum of the absolute values of the terms up to each position
(`assert_sums_close`): two summation orders of the same numbers differ by that much, not by
a fraction of a result that cancels to near zero.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from tests.reference import cumsum as reference
from tests.compiler.test_inline import evaluate
from tests.helpers import assert_sums_close, cluster_with_memory

# Budgets that give these small tensors one chunk, a few, and chunks of an element or two
# (the other axes are split first: lines of up to 40 are cut into as many as 8 pieces).
GRIDS = (2**30, 1024, 512, 256)
DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int8", "uint16",
          "bool"]


def run_all_grids(y, inputs, memories=GRIDS, workers: int = 2) -> list:
    """The result under each budget that plans it (the default plan at least), on a
    cluster of `workers` workers."""
    results = []
    for memory in memories:
        try:
            results.append(evaluate(y, memory, inputs, workers=workers)[0])
        except dx.PlanError:
            assert memory != memories[0]
    return results


def data(rng, shape, dtype) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# -- the operator --------------------------------------------------------------------------
def test_cumsum_is_one_scan_operator_whose_plan_is_linear_in_the_chunks():
    """Issue 30, item 11: (100, 8000) along its long axis was a sum over a triangular mask,
    8000 x 8000 terms per row (117 s). It is one node whose work is a few operations per
    element, and whose tasks grow linearly with the chunks along the scanned axis."""
    x = dx.input("x", (100, 8000), "float64")
    y = dx.cumsum(x, axis=1)
    assert [n.op for n in dx.build_graph(y).nodes] == ["input", "cumsum"]
    plan = compile_graph(dx.build_graph(y), cluster_with_memory(2**30))
    assert plan.stats().flops <= 4 * 100 * 8000
    for memory in (2**16, 2**14):
        plan = compile_graph(dx.build_graph(y), cluster_with_memory(memory))
        chunks = plan.chunks[y.node.id]
        n_chunks = math.prod(len(c) for c in chunks)
        assert len(chunks[1]) > 1  # the scanned axis itself is split
        (row,) = [r for r in plan.stats().nodes if r.node == y.node.id]
        # a result chunk each, the totals of all but the last along the axis, a carry each
        assert row.tasks <= 3 * n_chunks
        assert row.tasks == len(plan.lower(_bound(plan, x.shape)).dsk) - n_chunks


def _bound(plan, shape):
    from deepx_flow.runtime.inputs import bind_inputs
    return bind_inputs(plan.graph, {"x": np.zeros(shape)})


def test_a_long_axis_in_many_chunks_is_numpy_s_cumsum():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 8000))
    t = dx.input("x", x.shape, "float64")
    for axis in (1, 0, -1):
        for (got,) in [evaluate(dx.cumsum(t, axis=axis), m, {"x": x}) for m in (2**30, 2**16)]:
            assert_sums_close(got, np.cumsum(x, axis=axis),
                              np.cumsum(np.abs(x), axis=axis), rtol=1e-13)


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 3))
    axis = draw(st.integers(-ndim, ndim - 1))
    shape = tuple(draw(st.integers(0, 40 if a == axis % ndim else 6)) for a in range(ndim))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(DTYPES))
    return data(rng, shape, dtype), axis, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_cumsum_matches_numpy_on_every_grid(case):
    x, axis, exclusive, reverse = case
    t = dx.input("x", x.shape, x.dtype.name)
    y = dx.cumsum(t, axis=axis, exclusive=exclusive, reverse=reverse)
    # NumPy's dtype (bfloat16 keeps its own, as float16 does)
    want_dtype = "bfloat16" if x.dtype.name == "bfloat16" else np.cumsum(x[..., :1]).dtype.name
    assert y.dtype == want_dtype
    results = run_all_grids(y, {"x": x})
    for got in results:
        assert got.dtype == want_dtype and got.shape == x.shape
        if y.dtype in ("int64", "uint64"):  # exact, wrapping like NumPy's
            np.testing.assert_array_equal(got, reference(x, axis, exclusive, reverse,
                                                         y.dtype))
            continue
        want = reference(x, axis, exclusive, reverse)
        terms = reference(np.abs(x.astype(np.float64)), axis, exclusive, reverse)
        # float64 adds up with its own rounding; a smaller float is rounded once at the end
        rtol = {"float64": 1e-14 * max(1, x.shape[axis % x.ndim]), "float32": 2.0**-23,
                "float16": 2.0**-10, "bfloat16": 2.0**-7}[y.dtype]
        assert_sums_close(got.astype(np.float64), want, terms, rtol=rtol)
    # one grid or another, one answer: floats rounded once from float64 sums agree
    for got in results[1:]:
        if y.dtype != "float64":
            np.testing.assert_array_equal(got, results[0])


def test_the_result_does_not_depend_on_the_number_of_workers():
    x = np.random.default_rng(3).integers(-9, 9, size=(37, 29)).astype(np.int32)
    t = dx.input("x", x.shape, "int32")
    y = dx.cumsum(t, axis=0, reverse=True)
    want = reference(x, 0, reverse=True, dtype=np.int64)
    for workers in (1, 3, 8):
        for got in run_all_grids(y, {"x": x}, (2**30, 2048, 512), workers=workers):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_low_precision_floats_add_up_in_float64_and_round_once(dtype):
    """float16 values are multiples of 2**-24 below 2**16: float64 holds their prefix sums
    exactly (up to 2**13 terms), so the result is the exact prefix sum rounded once, on every
    grid; bfloat16 values of one scale likewise. float32 sums are float64's, rounded once."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 3000)) * 30).astype(dtype)
    t = dx.input("x", x.shape, dtype)
    want = np.cumsum(x.astype(np.float64), axis=1)
    for got in run_all_grids(dx.cumsum(t, axis=1), {"x": x}, (2**30, 2**14, 2**12)):
        assert got.dtype == x.dtype
        if dtype == "float32":
            assert_sums_close(got, want, np.cumsum(np.abs(x.astype(np.float64)), axis=1),
                              rtol=2.0**-23)
        else:
            np.testing.assert_array_equal(got, want.astype(dtype))
    if dtype == "float16":  # NumPy adding in float16 drifts far from it
        naive = np.cumsum(x, axis=1)
        assert np.abs(naive.astype(np.float64) - want).max() > 1


def test_integers_follow_numpy_s_dtype_rules_and_wrap_like_it():
    x = np.full((5, 300), 100, dtype=np.int8)
    t = dx.input("x", x.shape, "int8")
    y = dx.cumsum(t, axis=1)
    assert y.dtype == "int64"
    for got in run_all_grids(y, {"x": x}):
        np.testing.assert_array_equal(got, np.cumsum(x, axis=1))
    u = np.full((4,), 2**63, dtype=np.uint64)
    (got,) = evaluate(dx.cumsum(dx.input("u", u.shape, "uint64")), 2**30, {"u": u})
    np.testing.assert_array_equal(got, np.cumsum(u))


def test_axis_none_scans_the_flattened_tensor():
    x = np.arange(24.0).reshape(2, 3, 4)
    (got,) = evaluate(dx.cumsum(dx.input("x", x.shape, "float64"), axis=None), 1024, {"x": x})
    np.testing.assert_array_equal(got, np.cumsum(x))


def test_the_scanned_axis_is_split_for_parallelism_only_as_a_last_resort():
    """Splitting the scanned axis adds totals and carries to a plan; the other axes cost
    nothing to split, so a cluster's threads are given work along them first."""
    x = dx.input("x", (64, 2**16), "float32")
    plan = compile_graph(dx.build_graph(dx.cumsum(x, axis=1)),
                         cluster_with_memory(2**34, workers=4, threads=2))
    chunks = plan.chunks[plan.graph.outputs[0][1]]
    assert len(chunks[0]) > 1 and len(chunks[1]) == 1


# -- gradients -----------------------------------------------------------------------------
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_gradient_is_the_reversed_scan_of_the_cotangent(exclusive, reverse):
    rng = np.random.default_rng(9)
    x, r = rng.standard_normal((7, 40)), rng.standard_normal((7, 40))
    tx, tr = dx.input("x", x.shape, "float64"), dx.input("r", r.shape, "float64")
    loss = (dx.cumsum(tx, axis=-1, exclusive=exclusive, reverse=reverse) * tr).sum()
    g = dx.grad(loss, tx)
    assert "cumsum" in {n.op for n in dx.build_graph(g).nodes}
    analytic = reference(r, 1, exclusive, not reverse)
    numeric = np.empty_like(x)
    h = 1e-6
    for i in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[i] += h
        lo[i] -= h
        numeric[i] = ((reference(hi, 1, exclusive, reverse) * r).sum()
                      - (reference(lo, 1, exclusive, reverse) * r).sum()) / (2 * h)
    np.testing.assert_allclose(analytic, numeric, atol=1e-6)
    for memory in (2**30, 1024, 512):
        (got,) = evaluate(g, memory, {"r": r})  # linear: it reads the cotangent only
        np.testing.assert_allclose(got, analytic, rtol=1e-12, atol=1e-12)


def test_no_gradient_flows_to_an_integer_operand():
    x = dx.input("x", (4,), "float64")
    y = dx.cumsum(x.astype("int32")).astype("float64").sum()
    with pytest.raises(dx.GraphError, match="no gradient reaches"):
        dx.grad(y, x)


# -- the graph: errors and YAML ------------------------------------------------------------
def test_bad_arguments_are_graph_errors_naming_them():
    x = dx.input("x", (3, 4), "float32")
    with pytest.raises(dx.GraphError, match="axis 2 is out of range for 2-D input"):
        dx.cumsum(x, axis=2)
    with pytest.raises(dx.GraphError, match="axis must be an integer"):
        dx.cumsum(x, axis=1.0)
    with pytest.raises(dx.GraphError, match="exclusive must be true or false"):
        dx.cumsum(x, exclusive="yes")
    with pytest.raises(dx.GraphError, match="reverse must be true or false"):
        dx.cumsum(x, reverse=1)
    with pytest.raises(dx.GraphError, match="axis 0 is out of range for 0-D input"):
        dx.cumsum(dx.input("s", (), "float32"))


def test_a_spec_may_leave_out_the_defaults_and_count_axes_from_the_end():
    x = dx.input("x", (3, 4), "float32")
    y = dx.cumsum(x, axis=1)
    graph = dx.build_graph({"y": y})
    assert dx.from_yaml(dx.to_yaml(graph)) == graph
    text = ("deepx: 1\ninputs:\n  x: {shape: [3, 4], dtype: float32}\n"
            "nodes:\n  - {id: y, op: cumsum, args: [x], attrs: {axis: -1}}\noutputs: [y]\n")
    read = dx.from_yaml(text)
    node = read[read.outputs[0][1]]
    assert (node.op, dict(node.attrs)) == ("cumsum", dict(y.node.attrs))


def test_numpy_s_cumsum_of_a_tensor_takes_numpy_s_dtype_and_axis():
    x = np.full((3, 200), 100, dtype=np.int8)
    t = dx.input("x", x.shape, "int8")
    for kwargs in ({"axis": 1}, {"axis": 1, "dtype": "int8"}, {"axis": 0, "dtype": "float32"},
                   {}):
        want = np.cumsum(x, **kwargs)
        (got,) = evaluate(np.cumsum(t, **kwargs), 2**30, {"x": x})
        assert got.dtype == want.dtype, kwargs
        np.testing.assert_array_equal(got, want)


def test_memory_is_fitted_by_splitting_the_other_axes_first():
    """Rows of (100, 8000) fit a task a few at a time: no carries are needed for that."""
    x = dx.input("x", (100, 8000), "float32")
    plan = compile_graph(dx.build_graph(dx.cumsum(x, axis=1)), cluster_with_memory(2**20))
    chunks = plan.chunks[plan.graph.outputs[0][1]]
    assert len(chunks[0]) > 1 and len(chunks[1]) == 1


def test_a_stored_array_is_split_along_its_other_axis_first(tmp_path):
    """Both axes split along stored chunks for free, but a scanned one adds totals and
    carries: parallelism takes the rows' stored chunks first, then cuts the lines."""
    import zarr
    data = np.random.default_rng(4).standard_normal((256, 32768)).astype(np.float32)
    store = zarr.create_array(tmp_path / "x.zarr", shape=data.shape, chunks=(64, 4096),
                              dtype="float32")
    store[...] = data
    y = dx.cumsum(dx.read_zarr(str(tmp_path / "x.zarr")), axis=1)
    plan = compile_graph(dx.build_graph(y), cluster_with_memory(2**30, workers=4, threads=2))
    rows, lines = plan.chunks[y.node.id]
    assert rows == (64,) * 4 and len(lines) > 1
    (got,) = evaluate(y, 2**30, workers=4)
    assert_sums_close(got, np.cumsum(data.astype(np.float64), axis=1),
                      np.cumsum(np.abs(data.astype(np.float64)), axis=1), rtol=2.0**-23)
