"""`dx.take` (and `dx.nn.Embedding`) against `np.take`: any axis, negative and repeated
indices, any chunk grid; out-of-range indices raise; the gradient is a scatter-add."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from tests.compiler.test_differentiate import check_gradients
from tests.helpers import cluster_with_memory


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3),
       index_shape=st.lists(st.integers(0, 5), min_size=0, max_size=2),
       memory=st.sampled_from([2**30, 2048, 300]), data=st.data())
def test_take_matches_numpy(client, shape, index_shape, memory, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    rng = np.random.default_rng(len(shape) * 31 + memory % 97)
    x = rng.standard_normal(shape).astype(np.float32)
    indices = rng.integers(-n, n, size=index_shape)
    got = dx.run(dx.take(dx.input("x", x.shape, "float32"),
                         dx.input("i", indices.shape, "int64"), axis=axis),
                 inputs={"x": x, "i": indices}, client=client,
                 cluster=cluster_with_memory(memory))
    want = np.take(x, indices, axis=axis)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_an_index_out_of_range_raises_naming_it(client):
    x = dx.input("x", (4, 3), "float32")
    ids = dx.input("ids", (5,), "int32")
    with pytest.raises(dx.ExecutionError, match="index 4 is out of range for axis 0 of size 4"):
        dx.run(dx.take(x, ids), inputs={"x": np.zeros((4, 3), np.float32),
                                        "ids": np.array([0, 1, 4, 2, 3], np.int32)},
               client=client)
    with pytest.raises(dx.ExecutionError, match="index -5 is out of range"):
        dx.run(dx.take(x, ids), inputs={"x": np.zeros((4, 3), np.float32),
                                        "ids": np.array([0, -5, 1, 2, 3], np.int32)},
               client=client)


def test_bad_takes_are_refused_when_built():
    x = dx.input("x", (4, 3))
    with pytest.raises(dx.GraphError, match="indices must be integers"):
        dx.take(x, dx.input("f", (2,), "float32"))
    with pytest.raises(dx.GraphError, match="out of range"):
        dx.take(x, dx.input("i", (2,), "int64"), axis=2)


@pytest.mark.parametrize("axis", [0, 1])
def test_the_gradient_adds_each_element_back_at_its_index(client, axis):
    # Repeated and negative indices: several results add into one element.
    indices = np.array([[2, 0, -1], [2, 2, 1]])
    check_gradients(client, lambda x: dx.take(x, dx.input("ids", (2, 3), "int64") +
                                              dx.full((), 0, "int64"), axis=axis),
                    {"x": ((4, 5), -1, 1)}, extra={"ids": indices})


def test_an_embedding_trains(client):
    # Four classes, each with its own token: the embedding rows learn to separate them.
    ids = np.arange(400) % 4
    model = dx.nn.Sequential(dx.nn.Embedding(4, 3, dtype="float64"),
                             dx.nn.Linear(3, 4, dtype="float64"))
    fit = dx.train(lambda p, x, y: dx.nn.cross_entropy(model(p, x), y), model.init(seed=2),
                   data=(ids, ids), batch_size=40, epochs=5, progress=False, client=client,
                   optimizer=dx.optim.Adam(lr=0.05))
    assert fit.history[-1]["loss"] < 0.1 < fit.history[0]["loss"]
    table = fit.values["0.weight"]
    logits = dx.run(model(fit.params, dx.input("ids", (4,), "int64")),
                    inputs={**fit.inputs, "ids": np.arange(4)}, client=client)
    np.testing.assert_array_equal(logits.argmax(axis=1), np.arange(4))
    assert table.shape == (4, 3)


def test_take_in_a_yaml_spec(client, tmp_path):
    spec = tmp_path / "take.yaml"
    spec.write_text("deepx: 1\n"
                    "inputs:\n"
                    "  table: {shape: [5, 3], dtype: float32}\n"
                    "  ids: {shape: [4], dtype: int64}\n"
                    "nodes:\n"
                    "  - {id: rows, op: take, args: [table, ids], attrs: {axis: -2}}\n"
                    "outputs: [rows]\n")
    graph = dx.from_yaml(spec)
    assert graph["rows"].attr("axis") == 0  # normalized
    assert dx.from_yaml(dx.to_yaml(graph)) == graph
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    ids = np.array([4, 0, -1, 2])
    got = dx.run(graph, inputs={"table": table, "ids": ids}, client=client)["rows"]
    np.testing.assert_array_equal(got, np.take(table, ids, axis=0))
