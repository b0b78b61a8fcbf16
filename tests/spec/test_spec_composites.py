"""Composite operators written in a spec (`spec/composites.py`): each of the table's
composites reads as the very nodes its Python function builds (the last one named as the
spec names it), so it computes what Python computes; what such a node gets wrong is refused
naming it, as a primitive's mistakes are; the gateway runs a graph that writes them."""

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.errors import GraphError
from deepx_flow.ops.table import operator_table
from deepx_flow.spec.reader import document_to_graph
from tests.gateway.test_http_app import http  # noqa: F401  (the gateway on loopback)

COMPOSITES = {n: op for n, op in operator_table().items() if op.kind == "composite"}

# Operands (name -> (shape, dtype)) and attributes for one use of each composite.
IMAGE = ((2, 3, 4, 4), "float32")
MATRIX = ((4, 5), "float32")
USES = {
    "argmax": ({"x": MATRIX}, {"axis": 1}),
    "argmin": ({"x": MATRIX}, {"axis": 0, "keepdims": True}),
    "clip": ({"x": MATRIX}, {"lo": -0.5, "hi": 0.5}),
    "pad": ({"x": MATRIX}, {"widths": [[1, 0], [0, 2]], "mode": "reflect"}),
    "take_along_axis": ({"x": MATRIX, "indices": ((4, 2), "int64")}, {"axis": 1}),
    "scatter": ({"x": MATRIX, "indices": ((4, 2), "int64"), "updates": ((4, 2), "float32")},
                {"axis": 1, "reduction": "add"}),
    "scatter_add": ({"x": MATRIX, "indices": ((4, 2), "int64"),
                     "updates": ((4, 2), "float32")}, {"axis": 1}),
    "zeros": ({}, {}),
    "ones": ({}, {}),
    "prelu": ({"x": IMAGE, "slope": ((3, 1, 1), "float32")}, {}),
    "conv_transpose": ({"x": IMAGE, "w": ((3, 2, 3, 3), "float32"), "b": ((2,), "float32")},
                       {"stride": [2, 2], "padding": [1, 1, 1, 1], "output_padding": [1, 1]}),
    "batch_norm": ({"x": IMAGE, "scale": ((3,), "float32"), "bias": ((3,), "float32"),
                    "mean": ((3,), "float32"), "var": ((3,), "float32")}, {"eps": 1e-3}),
    "layer_norm": ({"x": MATRIX, "scale": ((5,), "float32")}, {}),
    "instance_norm": ({"x": IMAGE, "scale": ((3,), "float32"), "bias": ((3,), "float32")}, {}),
    "group_norm": ({"x": IMAGE, "scale": ((3,), "float32"), "bias": ((3,), "float32")},
                   {"groups": 3}),
    "one_hot": ({"labels": ((4,), "int64")}, {"classes": 6}),
    "cross_entropy": ({"logits": MATRIX, "labels": ((4,), "int64")}, {"reduction": "sum"}),
    "mse": ({"predictions": MATRIX, "targets": MATRIX}, {}),
    "dropout": ({"x": MATRIX}, {"rate": 0.25, "seed": 7, "step": 3}),
    "global_avg_pool": ({"x": IMAGE}, {}),
    "global_max_pool": ({"x": IMAGE}, {}),
}
STATES = {"zeros": ((2, 3), "float64"), "ones": ((3,), None), "one_hot": (None, "float64")}
ONE_INPUT = ({"x": MATRIX}, {})  # (the activations: alpha and the like left at defaults)


def _use(name):
    return USES.get(name, ONE_INPUT)


def _python(name, operands):
    op = COMPOSITES[name]
    module, _, function = op.python.rpartition(".")
    fn = getattr(dx if module == "dx" else dx.nn, function)
    kwargs = {n: dx.input(n, s, d) for n, (s, d) in operands.items()}
    shape, dtype = STATES.get(name, (None, None))
    if shape is not None:
        kwargs["shape"] = shape
    if dtype is not None:
        kwargs["dtype"] = dtype
    return fn(**kwargs, **_use(name)[1])


def _spec(name, operands, attrs, **node) -> dict:
    shape, dtype = STATES.get(name, (None, None))
    fields = {"id": "y", "op": name, "args": list(operands), "attrs": attrs, **node}
    if shape is not None:
        fields.setdefault("shape", list(shape))
    if dtype is not None:
        fields.setdefault("dtype", dtype)
    return {"deepx": 1, "inputs": {n: {"shape": list(s), "dtype": d}
                                   for n, (s, d) in operands.items()},
            "nodes": [fields], "outputs": ["y"]}


def test_every_composite_has_a_use_here():
    assert set(COMPOSITES) - set(USES) == {n for n, op in COMPOSITES.items()
                                           if op.input_names() == ("x",) and
                                           not any(a.required for a in op.attrs)} - set(USES)


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_a_composite_reads_as_the_nodes_its_python_function_builds(name):
    operands, attrs = _use(name)
    built = dx.build_graph(_python(name, operands).named("y"))
    read = document_to_graph(_spec(name, operands, attrs))
    last = built.nodes[-1]
    named = type(last)("y", last.op, last.inputs, last.shape, last.dtype, last.attrs)
    # the same nodes (in the reader's canonical order: the spec node's operands first)
    assert {n.id: n for n in read.nodes} == {n.id: n for n in built.nodes[:-1] + (named,)}
    assert read.nodes[-1] == named and read.outputs == (("y", "y"),)


@pytest.mark.parametrize("name", ["argmax", "leaky_relu", "clip", "pad", "one_hot",
                                  "global_avg_pool"])
def test_a_composite_in_a_spec_computes_numpys_answer(name):
    operands, attrs = _use(name)
    rng = np.random.default_rng(2)
    data = {n: (rng.integers(0, 4, s) if d == "int64" else rng.standard_normal(s))
            .astype(d) for n, (s, d) in operands.items()}
    got = dx.run(document_to_graph(_spec(name, operands, attrs)), inputs=data)["y"]
    x = data.get("x", data.get("labels")).astype(np.float64)
    want = {"argmax": lambda: x.argmax(axis=1),
            "leaky_relu": lambda: np.where(x > 0, x, 0.01 * x),
            "clip": lambda: np.clip(x, -0.5, 0.5),
            "pad": lambda: np.pad(x, [[1, 0], [0, 2]], mode="reflect"),
            "one_hot": lambda: np.eye(6)[data["labels"]],
            "global_avg_pool": lambda: x.mean(axis=(2, 3), keepdims=True)}[name]()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_composite_that_gives_its_operand_back_is_a_node_of_its_own():
    """`pad` by nothing is its operand: the spec's node is still a node (an identity
    reshape), which the outputs can name."""
    operands = {"x": MATRIX}
    graph = document_to_graph(_spec("pad", operands, {"widths": [[0, 0], [0, 0]]}))
    assert graph.nodes[-1].id == "y" and graph.nodes[-1].inputs == ("x",)
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(dx.run(graph, inputs={"x": x})["y"], x)


@pytest.mark.parametrize("node, says", [
    ({"op": "argmax", "args": ["x"], "attrs": {"axes": 1}},
     "argmax has no attribute 'axes' (allowed: axis, keepdims); did you mean 'axis'?"),
    ({"op": "argmx", "args": ["x"]}, "unknown operator 'argmx' (did you mean 'argmax'?)"),
    ({"op": "one_hot", "args": ["x"]}, "one_hot needs attribute 'classes'"),
    ({"op": "leaky_relu", "args": ["x", "x"]}, "leaky_relu takes 1 input(s) (x), got 2"),
    ({"op": "clip", "args": ["x"]}, "clip needs lo, hi or both"),
    ({"op": "leaky_relu", "args": ["x"], "shape": [5, 4]},
     "leaky_relu gives shape (4, 5), but the node states (5, 4)"),
    ({"op": "argmax", "args": ["x"], "attrs": {"axis": 2}}, "axis 2"),
    ({"op": "pad", "args": ["x"], "attrs": {"widths": "wide"}}, "pad"),
    ({"op": "leaky_relu", "args": ["x"], "alpha": 0.1},
     "'alpha' is an attribute of leaky_relu: put it under attrs"),
    ({"op": "zeros", "dtype": "float32"}, "zeros needs a declared shape"),
    ({"op": "conv_transpose", "args": ["x", "x"], "attrs": {"groups": 0}},
     "conv_transpose"),  # (refused by name, never a ZeroDivisionError)
    ({"op": "pad", "args": ["x"], "attrs": {"widths": [[1, 1], [0, 0]], "mode": 3}}, "pad"),
])
def test_what_a_composite_node_gets_wrong_is_refused_naming_it(node, says):
    spec = {"deepx": 1, "inputs": {"x": {"shape": [4, 5], "dtype": "float32"}},
            "nodes": [{"id": "bad", **node}], "outputs": ["bad"]}
    with pytest.raises(GraphError) as caught:
        document_to_graph(spec)
    assert caught.value.node == "bad" and says in str(caught.value), str(caught.value)


def test_the_gateway_runs_a_graph_that_writes_composites(http):
    """Over the contract's HTTP mirror, as a program in another language sends it."""
    spec = {"deepx": 1, "inputs": {"x": {"shape": [4, 5], "dtype": "float32"}},
            "nodes": [{"id": "a", "op": "leaky_relu", "args": ["x"], "attrs": {"alpha": 0.5}},
                      {"id": "m", "op": "argmax", "args": ["a"], "attrs": {"axis": -1}}],
            "outputs": ["a", "m"]}
    x = np.random.default_rng(4).standard_normal((4, 5)).astype(np.float32)
    answer = http.post("/v1/graphs:execute", json={
        "graph": spec, "inputs": [{"name": "x", "shape": [4, 5], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]})
    assert answer.status_code == 200, answer.text
    got = {t["name"]: np.array(t["data"]).reshape(t["shape"])
           for t in answer.json()["outputs"]}
    a = np.where(x > 0, x, np.float32(0.5) * x)
    np.testing.assert_array_equal(got["a"].astype(np.float32), a)
    np.testing.assert_array_equal(got["m"], a.argmax(axis=-1))
    bad = http.post("/v1/graphs:execute", json={
        "graph": {**spec, "nodes": [{"id": "m", "op": "argmax", "args": ["x"],
                                     "attrs": {"axes": 1}}], "outputs": ["m"]},
        "inputs": [{"name": "x", "shape": [4, 5], "datatype": "FP32",
                    "data": x.ravel().tolist()}]})
    assert bad.status_code == 400 and "did you mean 'axis'?" in bad.json()["error"]


def test_conv_transpose_refuses_a_stride_it_would_take_as_one():
    spec = {"deepx": 1, "inputs": {"x": {"shape": [1, 2, 4, 4], "dtype": "float32"},
                                   "w": {"shape": [2, 3, 2, 2], "dtype": "float32"}},
            "nodes": [{"id": "y", "op": "conv_transpose", "args": ["x", "w"],
                       "attrs": {"stride": 0}}], "outputs": ["y"]}
    for stride, padding in [(0, 0), (-1, 0), (1, -1)]:
        spec["nodes"][0]["attrs"] = {"stride": stride, "padding": padding}
        with pytest.raises(GraphError, match="conv_transpose: strides, dilations and groups"):
            document_to_graph(spec)


@pytest.mark.parametrize("attrs", [{"kernel": 2}, {"kernel": [2, 2], "strides": 1},
                                   {"kernel": [2, 2], "dilations": 1}])
def test_a_window_attribute_given_as_one_int_is_refused_by_name(attrs):
    """(a primitive's window attributes are lists, one value per spatial axis: a bare int
    was a TypeError, which the gateway answered 500)"""
    spec = {"deepx": 1, "inputs": {"x": {"shape": [1, 1, 4, 4], "dtype": "float32"}},
            "nodes": [{"id": "y", "op": "max_pool", "args": ["x"], "attrs": attrs}],
            "outputs": ["y"]}
    with pytest.raises(GraphError, match="max_pool: .* must be 2 .*integers, got 2|got 1"):
        document_to_graph(spec)
