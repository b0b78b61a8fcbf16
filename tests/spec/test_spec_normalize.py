"""What a spec may abbreviate reads as the explicit nodes the SDK builds: axes, defaults,
slice bounds, reshape's -1 and scalar literals (typed as NumPy 2 types Python scalars)."""

from __future__ import annotations

import pytest

import deepx_flow as dx
from deepx_flow.spec.yaml_io import from_yaml

X = dx.input("x", (4, 6, 8), "float32")


def one_node(node: str, inputs: str = "x: {shape: [4, 6, 8], dtype: float32}"):
    graph = from_yaml(f"deepx: 1\ninputs: {{{inputs}}}\nnodes:\n  - {node}\noutputs: [n]\n")
    return graph["n"]


@pytest.mark.parametrize("written,sdk", [
    ("{axes: 1}", X.sum(axis=1)),
    ("{axes: -1}", X.sum(axis=2)),
    ("{axes: [2, -3]}", X.sum(axis=(0, 2))),
    ("{axes: null}", X.sum()),
    ("{}", X.sum()),
    ("{axes: [0], keepdims: true}", X.sum(axis=0, keepdims=True)),
])
def test_reduction_axes_are_normalized(written, sdk):
    node = one_node(f"{{id: n, op: sum, args: [x], attrs: {written}}}")
    assert node.attrs == sdk.node.attrs
    assert node.shape == sdk.shape


@pytest.mark.parametrize("node,sdk", [
    ("{id: n, op: softmax, args: [x]}", dx.softmax(X)),
    ("{id: n, op: log_softmax, args: [x], attrs: {axis: -2}}", dx.log_softmax(X, axis=1)),
    ("{id: n, op: transpose, args: [x]}", X.T),
    ("{id: n, op: transpose, args: [x], attrs: {axes: [-1, 0, 1]}}", X.transpose(2, 0, 1)),
    ("{id: n, op: concat, args: [x, x], attrs: {axis: -1}}", dx.concat([X, X], axis=2)),
    ("{id: n, op: concat, args: [x, x]}", dx.concat([X, X])),
    ("{id: n, op: slice, args: [x], attrs: {starts: [1, -4, null], stops: [-1, 100, null],"
     " steps: [1, 2, 3]}}", X[1:-1, -4::2, ::3]),
    ("{id: n, op: slice, args: [x], attrs: {steps: [2, 1, 1]}}", X[::2]),
    ("{id: n, op: reshape, args: [x], shape: [-1, 8]}", X.reshape(-1, 8)),
    ("{id: n, op: random_normal, shape: [3], dtype: float32, attrs: {seed: 5}}",
     dx.random.normal((3,), seed=5)),
    ("{id: n, op: random_normal, shape: [3], dtype: float32, attrs: {seed: 5, std: 2}}",
     dx.random.normal((3,), seed=5, std=2.0)),
    ("{id: n, op: random_uniform, shape: [3], dtype: float64, attrs: {seed: 1, high: 3}}",
     dx.random.uniform((3,), seed=1, high=3.0, dtype="float64")),
])
def test_defaults_and_negative_axes_read_as_the_sdk_writes_them(node, sdk):
    got = one_node(node)
    assert (got.attrs, got.shape, got.dtype) == (sdk.node.attrs, sdk.shape, sdk.dtype)
    # Float parameters are floats in the IR, as the SDK makes them (`std: 2` is 2.0).
    assert [type(v) for _, v in got.attrs] == [type(v) for _, v in sdk.node.attrs]


def test_source_nodes_read_like_the_sdk_get_its_id():
    # Declared nodes keep the spec's id, but everything else is the SDK's node.
    got = one_node("{id: n, op: random_normal, shape: [3], dtype: float32, attrs: {seed: 5}}")
    sdk = dx.random.normal((3,), seed=5).node
    assert got.id == "n" and got.op == sdk.op and got.attrs == sdk.attrs


@pytest.mark.parametrize("args,inputs,sdk", [
    ("[x, 1.0]", "x: {shape: [2], dtype: float32}",
     lambda: dx.input("x", (2,), "float32") + 1.0),
    ("[2, x]", "x: {shape: [2], dtype: int16}", lambda: 2 + dx.input("x", (2,), "int16")),
    ("[x, 2.5]", "x: {shape: [2], dtype: int32}", lambda: dx.input("x", (2,), "int32") + 2.5),
    ("[x, true]", "x: {shape: [2], dtype: uint8}", lambda: dx.input("x", (2,), "uint8") + True),
    ("[x, 3]", "x: {shape: [2], dtype: bool}", lambda: dx.input("x", (2,), "bool") + 3),
    ("[1.5, 2]", "x: {shape: [2], dtype: bool}", lambda: dx.add(dx.full((), 1.5),
                                                                 dx.full((), 2))),
])
def test_literals_are_typed_like_the_sdk_types_python_scalars(args, inputs, sdk):
    expected = sdk()
    got = one_node(f"{{id: n, op: add, args: {args}}}", inputs)
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
    # The literal nodes are the SDK's constants, content-hash ids included.
    assert got.inputs == expected.node.inputs


def test_where_literals_are_typed_against_the_values_not_the_condition():
    c = dx.input("c", (2,), "bool")
    h = dx.input("h", (2,), "float16")
    got = one_node("{id: n, op: where, args: [c, 0.0, h]}",
                   "c: {shape: [2], dtype: bool}, h: {shape: [2], dtype: float16}")
    expected = dx.where(c, 0.0, h)
    assert got.dtype == "float16" and got.inputs == expected.node.inputs


def test_yaml12_exponent_floats_are_numbers():
    # JSON and YAML 1.2 writers put `1e-05`; PyYAML (YAML 1.1) reads that as a string.
    got = one_node("{id: n, op: random_normal, shape: [2], dtype: float32,"
                   " attrs: {seed: 0, std: 1e-05, mean: 2.5E3}}")
    assert got.attr("std") == 1e-05 and got.attr("mean") == 2500.0
    graph = from_yaml('{"deepx": 1, "inputs": {"x": {"shape": [2], "dtype": "float64"}},'
                      ' "nodes": [{"id": "n", "op": "mul", "args": ["x", 1e+300]}],'
                      ' "outputs": ["n"]}')
    assert graph[graph["n"].inputs[1]].attr("value") == 1e300


def test_same_literal_twice_is_one_node():
    graph = from_yaml("""
deepx: 1
inputs: {x: {shape: [2], dtype: float32}}
nodes:
  - {id: a, op: add, args: [x, 1.0]}
  - {id: n, op: mul, args: [a, 1.0]}
outputs: [n]
""")
    assert graph["a"].inputs[1] == graph["n"].inputs[1]
    assert [n.op for n in graph.nodes] == ["input", "full", "add", "mul"]


def test_unused_nodes_are_kept_after_the_needed_ones():
    graph = from_yaml("""
deepx: 1
inputs: {x: {shape: [2], dtype: float32}, spare: {shape: [1], dtype: int8}}
nodes:
  - {id: unused, op: exp, args: [x]}
  - {id: n, op: neg, args: [x]}
outputs: [n]
""")
    assert [n.id for n in graph.nodes] == ["x", "n", "spare", "unused"]
