"""`dx.call(graph, ...)`: a graph as a function of tensors computes what the graph computes
(run both, compare to the bit), composes with SDK code, and names what does not fit."""

from pathlib import Path

import numpy as np
import pytest

import deepx_flow as dx

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"


def _inputs(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {n.id: (rng.integers(-9, 9, n.shape).astype(n.dtype)
                   if np.dtype(n.dtype).kind in "iu"
                   else rng.standard_normal(n.shape).astype(n.dtype)) for n in graph.inputs}


def test_a_called_spec_computes_what_the_spec_computes(client):
    graph = dx.from_yaml(GRAPHS / "reductions.yaml")
    arrays = _inputs(graph)
    tensors = {n.id: dx.input(n.id, n.shape, n.dtype) for n in graph.inputs}
    called = dx.call(graph, tensors)
    assert list(called) == [name for name, _ in graph.outputs]
    want = dx.run(graph, inputs=arrays, client=client)
    got = dx.run(called, inputs=arrays, client=client)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_spec_composes_with_sdk_code_on_both_sides(client):
    spec = dx.from_yaml("""
deepx: 1
inputs:
  a: {shape: [4, 3], dtype: float64}
  b: {shape: [3], dtype: float64}
nodes:
  - {id: s, op: add, args: [a, b]}
  - {id: m, op: max, args: [s], attrs: {axes: 1}}
outputs: [m]
""")
    x = dx.input("x", (4, 3), "float64")
    m = dx.call(spec, a=dx.exp(x), b=dx.full((3,), 0.5, "float64"))["m"]
    y = m * 2.0
    data = np.random.default_rng(1).standard_normal((4, 3))
    got = dx.run(y, inputs={"x": data}, client=client)
    np.testing.assert_array_equal(got, (np.exp(data) + 0.5).max(axis=1) * 2.0)


@pytest.mark.parametrize("given, says", [
    ({}, r"input\(s\) 'x' not given"),
    ({"x": "t", "z": "t"}, r"no input\(s\) 'z'"),
    ({"x": np.zeros(2)}, "a Tensor, not ndarray"),
    ({"x": ("input", (3,), "float32")}, r"float64\(2,\) in the graph, given float32\(3,\)"),
])
def test_what_does_not_fit_is_named(given, says):
    spec = dx.from_yaml("""
deepx: 1
inputs:
  x: {shape: [2], dtype: float64}
nodes:
  - {id: y, op: neg, args: [x]}
outputs: [y]
""")
    given = {k: dx.input(k, (2,), "float64") if isinstance(v, str) else
             dx.input(k, v[1], v[2]) if isinstance(v, tuple) else v for k, v in given.items()}
    with pytest.raises(dx.InputError, match=says):
        dx.call(spec, given)
    with pytest.raises(dx.InputError, match="takes a dx.Graph"):
        dx.call({"deepx": 1}, {})
