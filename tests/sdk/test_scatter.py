"""Scatters and element gathers (`dx.scatter`, `dx.scatter_add`, `dx.scatter_nd`,
`dx.take_along_axis`, `dx.gather_nd`) against NumPy in float64: any shapes, axes, repeated
and negative indices, indices shorter than x, every reduction, under the default plan and
under budgets that force many chunks; indices out of range fail naming the index; gradients
equal central finite differences; malformed graphs are GraphErrors naming the node.

The references below loop over the indices in C order one update at a time, so a repeated
index with reduction "none" keeps the last update, the rule `ops/scatter.py` defines.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from tests.compiler.test_inline import evaluate
from tests.helpers import cluster_with_memory

REDUCTIONS = ["none", "add", "mul", "max", "min"]
# Budgets that give these small tensors one chunk, a few, and chunks of an element or two
# along the axes that may be split (a grid that cannot hold a whole axis is skipped).
GRIDS = (2**30, 2048, 1024, 512)
APPLY = {"none": lambda old, new: new, "add": np.add, "mul": np.multiply,
         "max": np.maximum, "min": np.minimum}


def scatter_reference(x, indices, updates, axis, reduction):
    out = x.copy()
    n = x.shape[axis]
    for p in np.ndindex(indices.shape):
        target = list(p)
        target[axis] = int(indices[p]) % n
        out[tuple(target)] = APPLY[reduction](out[tuple(target)], updates[p])
    return out


def scatter_nd_reference(x, indices, updates, reduction):
    out = x.copy()
    for p in np.ndindex(indices.shape[:-1]):
        target = tuple(int(i) % n for i, n in zip(indices[p], x.shape))
        out[target] = APPLY[reduction](out[target], updates[p])
    return out


def gather_nd_reference(x, indices):
    k = indices.shape[-1]
    out = np.empty(indices.shape[:-1] + x.shape[k:], x.dtype)
    for p in np.ndindex(indices.shape[:-1]):
        out[p] = x[tuple(int(i) for i in indices[p])]
    return out


def run_all_grids(outputs, inputs, memories=GRIDS) -> list:
    """Each budget's results (the default plan's first); a budget too small for the graph's
    whole axes is skipped, and at least the default plan runs."""
    results = []
    for memory in memories:
        try:
            results.append(evaluate(outputs, memory, inputs))
        except dx.PlanError:
            assert memory != memories[0]
    return results


def _inputs(**arrays):
    return {name: dx.input(name, a.shape, a.dtype.name) for name, a in arrays.items()}


@st.composite
def element_cases(draw):
    """x, indices and updates of x's rank: indices at most x's extent along the other axes
    (often less), any length along `axis`, values drawn from a few (so repeated) in -n..n-1."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(0, ndim - 1))
    n = shape[axis]
    index_shape = tuple(draw(st.integers(0, 6)) if a == axis else draw(st.integers(1, s))
                        for a, s in enumerate(shape))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    pool = rng.integers(-n, n, size=draw(st.integers(1, 3)))  # few values: repeats
    indices = rng.choice(pool, size=index_shape).astype(draw(st.sampled_from(["int64",
                                                                             "int32"])))
    x = rng.standard_normal(shape)
    updates = rng.standard_normal(index_shape)
    return x, indices, updates, axis


@settings(max_examples=40, deadline=None)
@given(case=element_cases(), reduction=st.sampled_from(REDUCTIONS))
def test_scatter_matches_numpy_on_every_grid(case, reduction):
    x, indices, updates, axis = case
    t = _inputs(x=x, i=indices, u=updates)
    y = dx.scatter(t["x"], t["i"], t["u"], axis=axis, reduction=reduction)
    want = scatter_reference(x, indices, updates, axis, reduction)
    for (got,) in run_all_grids(y, {"x": x, "i": indices, "u": updates}):
        assert got.dtype == np.float64
        # The same updates meet each position in the same order on any grid: exact.
        np.testing.assert_array_equal(got, want)


@settings(max_examples=30, deadline=None)
@given(case=element_cases())
def test_take_along_axis_matches_numpy_on_every_grid(case):
    x, indices, _, axis = case
    t = _inputs(x=x, i=indices)
    y = dx.take_along_axis(t["x"], t["i"], axis=axis)
    region = tuple(slice(0, s) if a != axis else slice(None)
                   for a, s in enumerate(indices.shape))
    want = np.take_along_axis(x[region], indices.astype(np.int64), axis=axis)
    for (got,) in run_all_grids(y, {"x": x, "i": indices}):
        np.testing.assert_array_equal(got, want)


@st.composite
def nd_cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    k = draw(st.integers(1, ndim))
    lead = tuple(draw(st.lists(st.integers(0, 3), min_size=0, max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    indices = np.stack([rng.integers(-n, n, size=lead) for n in shape[:k]], axis=-1)
    x = rng.standard_normal(shape)
    updates = rng.standard_normal(lead + shape[k:])
    return x, indices.astype(np.int64), updates


@settings(max_examples=40, deadline=None)
@given(case=nd_cases(), reduction=st.sampled_from(REDUCTIONS))
def test_scatter_nd_and_gather_nd_match_numpy_on_every_grid(case, reduction):
    x, indices, updates = case
    t = _inputs(x=x, i=indices, u=updates)
    outputs = [dx.scatter_nd(t["x"], t["i"], t["u"], reduction=reduction),
               dx.gather_nd(t["x"], t["i"])]
    want = [scatter_nd_reference(x, indices, updates, reduction),
            gather_nd_reference(x, indices)]
    for got in run_all_grids(outputs, {"x": x, "i": indices, "u": updates}):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_the_last_update_of_a_repeated_index_wins_on_every_grid():
    # Along axis 1 each row writes columns 1 and 3 several times: 40. and 20. are the last.
    x = np.zeros((64, 5))
    indices = np.tile(np.array([1, 3, 1, 1, 3, -4]), (64, 1))
    updates = np.tile(np.array([10.0, 50.0, 30.0, 40.0, 20.0, 60.0]), (64, 1))
    t = _inputs(x=x, i=indices, u=updates)
    y = dx.scatter(t["x"], t["i"], t["u"], axis=1)
    for memory in (2**30, 8 * 2**10, 2 * 2**10):
        (got,) = evaluate(y, memory, {"x": x, "i": indices, "u": updates})
        np.testing.assert_array_equal(got, np.tile([0.0, 60.0, 0, 20.0, 0], (64, 1)))
    plan = compile_graph(dx.build_graph(y), cluster_with_memory(2 * 2**10))
    assert len(plan.chunks[y.node.id][0]) > 1  # the last budget split the rows


def test_blocks_past_the_indices_extent_pass_x_through():
    """Indices cover the first 3 of 40 rows: the tasks of later row chunks read no indices
    and return their block of x."""
    x = np.arange(40 * 4, dtype=np.float64).reshape(40, 4)
    indices = np.array([[0, 1], [2, 2], [-1, 0]])
    updates = np.array([[100.0, 200.0], [300.0, 400.0], [500.0, 600.0]])
    t = _inputs(x=x, i=indices, u=updates)
    y = dx.scatter_add(t["x"], t["i"], t["u"], axis=1)
    plan = compile_graph(dx.build_graph(y), cluster_with_memory(2 * 2**10))
    assert len(plan.chunks[y.node.id][0]) > 1
    (got,) = evaluate(y, 2 * 2**10, {"x": x, "i": indices, "u": updates})
    np.testing.assert_array_equal(got, scatter_reference(x, indices, updates, 1, "add"))


def test_a_scalar_update_is_broadcast_to_the_indices():
    x = np.ones((3, 4))
    indices = np.array([[0, 2, 1, 0]])
    t = _inputs(x=x, i=indices)
    (got,) = evaluate(dx.scatter(t["x"], t["i"], 0.0), 2**30, {"x": x, "i": indices})
    want = np.ones((3, 4))
    want[indices[0], np.arange(4)] = 0.0
    np.testing.assert_array_equal(got, want)


def test_integer_scatter_add_is_exact():
    x = np.zeros(6, np.int64)
    indices = np.array([5, 0, 5, 5, -1])
    t = _inputs(x=x, i=indices, u=np.ones(5, np.int64))
    (got,) = evaluate(dx.scatter_add(t["x"], t["i"], t["u"]), 2**30,
                      {"x": x, "i": indices, "u": np.ones(5, np.int64)})
    np.testing.assert_array_equal(got, [1, 0, 0, 0, 0, 4])


# -- indices out of range ------------------------------------------------------------------
@pytest.mark.parametrize("bad", [5, -6])
def test_an_index_out_of_range_fails_naming_it_and_the_axis(client, bad):
    x = np.zeros((3, 5))
    indices = np.array([[0, bad], [1, 2]])
    updates = np.ones((2, 2))
    t = _inputs(x=x, i=indices, u=updates)
    for y in (dx.scatter(t["x"], t["i"], t["u"], axis=1),
              dx.scatter_add(t["x"], t["i"], t["u"], axis=1),
              dx.take_along_axis(t["x"], t["i"], axis=1)):
        with pytest.raises(dx.ExecutionError,
                           match=rf"{y.node.op}: index {bad} is out of range for axis 1 of "
                                 "size 5"):
            dx.run(y, inputs={k: v for k, v in {"x": x, "i": indices, "u": updates}.items()
                              if k in {n.id for n in dx.build_graph(y).inputs}},
                   client=client)


def test_an_index_row_out_of_range_fails_naming_its_column_axis(client):
    x = np.zeros((4, 3, 2))
    indices = np.array([[0, 1], [3, 3]])  # column 1 addresses axis 1, of size 3
    t = _inputs(x=x, i=indices, u=np.ones((2, 2)))
    for y in (dx.scatter_nd(t["x"], t["i"], t["u"]), dx.gather_nd(t["x"], t["i"])):
        with pytest.raises(dx.ExecutionError,
                           match=rf"{y.node.op}: index 3 is out of range for axis 1 of size 3"):
            dx.run(y, inputs={k: v for k, v in {"x": x, "i": indices,
                                                "u": np.ones((2, 2))}.items()
                              if k in {n.id for n in dx.build_graph(y).inputs}},
                   client=client)


# -- gradients -----------------------------------------------------------------------------
def check_vjp(build, reference, values: dict, wrt: tuple[str, ...], fixed: dict,
              budgets=GRIDS, h: float = 1e-6) -> None:
    """The engine's gradients of sum(r * build(...)) with respect to `wrt`, under each budget
    that plans it (at least two), against central differences of `reference` in NumPy."""
    rng = np.random.default_rng(7)
    tensors = _inputs(**values, **fixed)
    y = build(**tensors)
    r = rng.uniform(-1, 1, size=y.shape)
    loss = (y * dx.input("r", y.shape, "float64")).sum()
    grads = dx.grad(loss, [tensors[n] for n in wrt])
    every = {**values, **fixed, "r": r}
    expected = []
    for name in wrt:
        x = values[name]
        num = np.empty_like(x)
        for i in np.ndindex(x.shape):
            hi, lo = x.copy(), x.copy()
            hi[i] += h
            lo[i] -= h
            f_hi = (reference(**{**values, **fixed, name: hi}) * r).sum()
            f_lo = (reference(**{**values, **fixed, name: lo}) * r).sum()
            num[i] = (f_hi - f_lo) / (2 * h)
        expected.append(num)
    needed = {n.id for n in dx.build_graph(grads).inputs}
    ran = 0
    for memory in budgets:
        try:
            got = evaluate(grads, memory, {k: v for k, v in every.items() if k in needed})
        except dx.PlanError:
            continue
        ran += 1
        for name, g, e in zip(wrt, got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6,
                                       err_msg=f"d/d{name} with budget {memory}")
    assert ran >= 2


INDICES = np.array([[2, 0, -1, 2, 1], [2, 2, 1, 0, -4], [1, -1, 1, 0, 2]])  # repeats


@pytest.mark.parametrize("reduction", ["add", "none"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_gradients_equal_finite_differences(reduction, axis):
    indices = INDICES if axis == 0 else INDICES.T.copy() % 3
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6) if axis == 0 else (6, 4))
    updates = rng.standard_normal(indices.shape)
    n = x.shape[axis]
    check_vjp(lambda x, u, i: dx.scatter(x, i, u, axis=axis, reduction=reduction),
              lambda x, u, i: scatter_reference(x, i, u, axis, reduction),
              {"x": x, "u": updates}, ("x", "u"), {"i": indices % n - (indices < 0) * n})


@pytest.mark.parametrize("reduction", ["add", "none"])
def test_scatter_nd_gradients_equal_finite_differences(reduction):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 5))
    indices = np.array([[[0, 1], [2, 3]], [[0, 1], [-1, 0]], [[1, 1], [0, 1]]])  # (0, 1) twice
    updates = rng.standard_normal((3, 2, 5))
    check_vjp(lambda x, u, i: dx.scatter_nd(x, i, u, reduction=reduction),
              lambda x, u, i: scatter_nd_reference(x, i, u, reduction),
              {"x": x, "u": updates}, ("x", "u"), {"i": indices})


def test_element_gather_gradients_equal_finite_differences():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6))
    check_vjp(lambda x, i: dx.take_along_axis(x, i, axis=0),
              lambda x, i: np.take_along_axis(x[:, :5], i % 4, axis=0),
              {"x": x}, ("x",), {"i": INDICES})
    check_vjp(lambda x, i: dx.gather_nd(x, i),
              lambda x, i: gather_nd_reference(x, i),
              {"x": x}, ("x",), {"i": np.array([[[1], [3]], [[1], [0]]])})


def test_a_repeated_index_sends_the_gradient_to_the_winning_update_only():
    x = dx.input("x", (4,), "float64")
    u = dx.input("u", (3,), "float64")
    i = dx.input("i", (3,), "int64")
    loss = dx.scatter(x, i, u).sum()
    gx, gu = dx.grad(loss, [x, u])
    got = evaluate([gx, gu], 2**30, {"i": np.array([2, 0, 2])})
    np.testing.assert_array_equal(got[0], [0.0, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(got[1], [0.0, 1.0, 1.0])


@pytest.mark.parametrize("reduction", ["mul", "max", "min"])
def test_differentiating_a_scatter_with_another_reduction_names_the_node(reduction):
    x = dx.input("x", (4, 3), "float64")
    u = dx.input("u", (2, 3), "float64")
    for y in (dx.scatter(x, dx.input("i", (2, 3), "int64"), u, reduction=reduction),
              dx.scatter_nd(x, dx.input("j", (2, 1), "int64"), u, reduction=reduction)):
        with pytest.raises(dx.GraphError,
                           match=rf"node '{y.node.id}': {y.node.op} with reduction "
                                 f"'{reduction}' has no gradient rule"):
            dx.grad(y.sum(), [x, u])


# -- graph errors --------------------------------------------------------------------------
@pytest.mark.parametrize("build, message", [
    (lambda x, i, u, f: dx.scatter(x, i, dx.input("v", (2, 4), "float32")),
     r"updates of shape \(2, 4\) for indices that write \(2, 3\)"),
    (lambda x, i, u, f: dx.scatter(x, i, dx.cast(u, "float64")),
     "updates are float64 but x is float32"),
    (lambda x, i, u, f: dx.scatter(x, f, u), "indices must be integers, got float32"),
    (lambda x, i, u, f: dx.scatter(x, dx.input("r", (6,), "int64"), dx.input("w", (6,))),
     "indices of rank 1 for a 2-D tensor"),
    (lambda x, i, u, f: dx.scatter(x, dx.input("k", (2, 5), "int64"),
                                   dx.input("w", (2, 5))),
     r"indices \(2, 5\) reach past x \(4, 3\) along axis 1"),
    (lambda x, i, u, f: dx.scatter(x, i, u, reduction="sum"),
     "reduction must be one of none, add, mul, max, min"),
    (lambda x, i, u, f: dx.scatter(x, i, u, axis=2), "axis 2 is out of range"),
    (lambda x, i, u, f: dx.scatter_nd(x, dx.input("r", (2, 3), "int64"), u),
     "must have 1 to 2 entries"),
    (lambda x, i, u, f: dx.scatter_nd(x, dx.input("r", (2, 1), "int64"), dx.input("w", (2,))),
     r"updates of shape \(2,\) for indices that write \(2, 3\)"),
    (lambda x, i, u, f: dx.take_along_axis(x, f), "indices must be integers"),
])
def test_malformed_scatters_are_refused_when_built(build, message):
    x = dx.input("x", (4, 3), "float32")
    i = dx.input("i", (2, 3), "int64")
    u = dx.input("u", (2, 3), "float32")
    f = dx.input("f", (2, 3), "float32")
    with pytest.raises(dx.GraphError, match=message):
        build(x, i, u, f)


def test_a_spec_names_the_malformed_node():
    spec = ("deepx: 1\n"
            "inputs:\n"
            "  x: {shape: [4, 3], dtype: float32}\n"
            "  i: {shape: [2, 3], dtype: int64}\n"
            "  u: {shape: [2, 2], dtype: float32}\n"
            "nodes:\n"
            "  - {id: written, op: scatter_elements, args: [x, i, u]}\n"
            "outputs: [written]\n")
    with pytest.raises(dx.GraphError, match=r"node 'written': scatter_elements: updates of "
                                            r"shape \(2, 2\)"):
        dx.from_yaml(spec)


def test_scatters_in_a_yaml_spec_read_back_and_run(client):
    spec = ("deepx: 1\n"
            "inputs:\n"
            "  x: {shape: [4, 3], dtype: float64}\n"
            "  i: {shape: [2, 3], dtype: int64}\n"
            "  u: {shape: [2, 3], dtype: float64}\n"
            "  rows: {shape: [2, 1], dtype: int64}\n"
            "nodes:\n"
            "  - {id: put, op: scatter_elements, args: [x, i, u], attrs: {axis: -2}}\n"
            "  - {id: added, op: scatter_elements, args: [x, i, u], "
            "attrs: {reduction: add}}\n"
            "  - {id: nd, op: scatter_nd, args: [x, rows, u]}\n"
            "  - {id: picked, op: gather_elements, args: [x, i]}\n"
            "  - {id: blocks, op: gather_nd, args: [x, rows]}\n"
            "outputs: [put, added, nd, picked, blocks]\n")
    graph = dx.from_yaml(spec)
    assert graph["put"].attrs == (("axis", 0), ("reduction", "none"))  # normalized
    assert dx.from_yaml(dx.to_yaml(graph)) == graph
    rng = np.random.default_rng(4)
    values = {"x": rng.standard_normal((4, 3)), "i": np.array([[3, 0, -1], [3, 1, 2]]),
              "u": rng.standard_normal((2, 3)), "rows": np.array([[1], [-1]])}
    got = dx.run(graph, inputs=values, client=client)
    x, i, u, rows = values["x"], values["i"], values["u"], values["rows"]
    np.testing.assert_array_equal(got["put"], scatter_reference(x, i, u, 0, "none"))
    np.testing.assert_array_equal(got["added"], scatter_reference(x, i, u, 0, "add"))
    np.testing.assert_array_equal(got["nd"], scatter_nd_reference(x, rows, u, "none"))
    np.testing.assert_array_equal(got["picked"], np.take_along_axis(x, i % 4, axis=0))
    np.testing.assert_array_equal(got["blocks"], x[[1, 3]])
