"""Everything that can be checked without data is checked when a spec is read: attribute
types, axes of 0-d tensors, the number of dimensions and elements, values that must fit their
dtype, random parameters, and hand-written fused programs. Each is one GraphError naming the
node, where a raw TypeError or IndexError came before or the run failed on a worker."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.lib.array_utils import normalize_axis_index

import deepx_flow as dx
from deepx_flow.errors import GraphError
from deepx_flow.ops.common import MAX_DIMS
from deepx_flow.spec.yaml_io import from_yaml, to_yaml
from tests.helpers import cluster_with_memory

HEADER = "deepx: 1\ninputs:\n  x: {shape: [4, 3], dtype: float32}\n"


def refused(text: str, *words: str) -> GraphError:
    with pytest.raises(GraphError) as info:
        from_yaml(text)
    message = str(info.value)
    assert all(w in message for w in words), message
    assert "\n" not in message and len(message) < 400
    return info.value


def one(node: str, header: str = HEADER) -> str:
    return header + f"nodes:\n - {node}\noutputs: [h]\n"


# -- axes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("node,words", [
    ("{id: h, op: sum, args: [x], attrs: {axes: 1.5}}", ["axes", "integer", "1.5"]),
    ("{id: h, op: max, args: [x], attrs: {axes: [0.0]}}", ["integer", "0.0"]),
    ("{id: h, op: mean, args: [x], attrs: {axes: true}}", ["integer", "True"]),
    ("{id: h, op: transpose, args: [x], attrs: {axes: 1}}", ["permutation", "1"]),
    ("{id: h, op: transpose, args: [x], attrs: {axes: 1.0}}", ["permutation", "1.0"]),
    ("{id: h, op: transpose, args: [x], attrs: {axes: [1.0, 0.0]}}", ["integer"]),
    ("{id: h, op: softmax, args: [x], attrs: {axis: [1]}}", ["axis must be an integer"]),
    ("{id: h, op: concat, args: [x, x], attrs: {axis: 0.5}}", ["axis must be an integer"]),
])
def test_axes_of_the_wrong_type_are_refused(node, words):
    err = refused(one(node), "node 'h'", *words)
    assert err.node == "h"


@pytest.mark.parametrize("op", ["max", "min", "sum", "mean"])
@pytest.mark.parametrize("axes", ["[0]", "0", "[-1]"])
def test_reducing_an_axis_of_a_0d_tensor_is_refused_like_numpy(op, axes):
    # NumPy's axis rule has no axis for a 0-d array (np.mean refuses axis=0; ufunc reductions
    # such as np.sum still accept 0 and -1 there, for old code): so the reader refuses it.
    with pytest.raises(np.exceptions.AxisError):
        normalize_axis_index(int(axes.strip("[]")), 0)
    refused(one(f"{{id: h, op: {op}, args: [1.0], attrs: {{axes: {axes}}}}}"), "node 'h'",
            "out of range for 0-D input")


@pytest.mark.parametrize("op", ["max", "min", "sum", "mean"])
def test_reducing_a_0d_tensor_over_no_axes_matches_numpy(op, client):
    graph = from_yaml(one(f"{{id: h, op: {op}, args: [2.5]}}", header="deepx: 1\n"))
    assert graph["h"].shape == () and graph["h"].attr("axes") == ()
    (out,) = dx.run(graph, client=client).values()
    np.testing.assert_array_equal(out, getattr(np, op)(np.float64(2.5)))


def test_softmax_of_a_0d_tensor_is_refused():
    refused(one("{id: h, op: softmax, args: [1.0]}"), "node 'h'", "0-D")


# -- dimensions and elements ---------------------------------------------------------------
def test_more_than_64_dimensions_are_refused():
    dims = ", ".join(["1"] * (MAX_DIMS + 1))
    refused(f"deepx: 1\ninputs:\n  x: {{shape: [{dims}], dtype: float32}}\noutputs: [x]\n",
            "node 'x'", f"{MAX_DIMS + 1} dimensions", f"at most {MAX_DIMS}")
    dims = ", ".join(["1"] * MAX_DIMS)
    assert from_yaml(f"deepx: 1\ninputs:\n  x: {{shape: [{dims}], dtype: float32}}\n"
                     "outputs: [x]\n")["x"].ndim == MAX_DIMS


def test_a_reshape_into_too_many_dimensions_is_refused():
    dims = ", ".join(["1"] * 100) + ", 4, 3"
    refused(one(f"{{id: h, op: reshape, args: [x], shape: [{dims}]}}"), "node 'h'",
            "102 dimensions")


@pytest.mark.parametrize("shape", ["[100000000000000000000000]", "[4294967296, 4294967296]"])
def test_an_element_count_past_int64_is_refused(shape):
    refused(f"deepx: 1\ninputs:\n  x: {{shape: {shape}, dtype: float32}}\noutputs: [x]\n",
            "node 'x'", "elements", "2**63")


def test_a_broadcast_past_int64_elements_is_refused_as_such():
    text = ("deepx: 1\ninputs:\n  x: {shape: [4294967296], dtype: float32}\n"
            "  y: {shape: [4294967296, 1], dtype: float32}\n"
            "nodes:\n - {id: h, op: add, args: [x, y]}\noutputs: [h]\n")
    err = refused(text, "node 'h'", "(4294967296, 4294967296)", "elements")
    assert "do not broadcast" not in str(err)


def test_broadcasting_follows_numpy():
    # The rule is plain arithmetic now; check it against NumPy on shapes that do and do not
    # broadcast.
    from deepx_flow.ir import Node
    from deepx_flow.ops.common import broadcast
    rng = np.random.default_rng(0)
    node = Node("h", "add", (), (), "float32")
    for _ in range(500):
        shapes = [tuple(int(s) for s in rng.choice([0, 1, 2, 3], size=rng.integers(0, 4)))
                  for _ in range(rng.integers(1, 4))]
        try:
            want = np.broadcast_shapes(*shapes)
        except ValueError:
            with pytest.raises(GraphError, match="do not broadcast"):
                broadcast(node, shapes)
        else:
            assert broadcast(node, shapes) == want


# -- values that must fit their dtype ------------------------------------------------------
@pytest.mark.parametrize("dtype,value", [
    ("int8", 1000), ("int8", -129), ("uint8", -1), ("uint64", 2**64), ("int32", 1.5),
    ("int64", ".nan"), ("int16", ".inf"), ("bool", 2), ("bool", 0.5), ("float32", 1.0e300),
    ("float16", 70000), ("float64", 10**309),
])
def test_full_value_that_does_not_fit_its_dtype_is_refused(dtype, value):
    refused(f"deepx: 1\nnodes:\n - {{id: h, op: full, shape: [3], dtype: {dtype}, "
            f"attrs: {{value: {value}}}}}\noutputs: [h]\n", "node 'h'", dtype, "fit")


@pytest.mark.parametrize("dtype,value", [
    ("int8", 127), ("int8", -128), ("uint8", 255), ("uint64", 2**64 - 1), ("int32", 7.0),
    ("bool", True), ("bool", 0), ("float16", 65504), ("float32", ".inf"), ("float64", ".nan"),
    ("float32", 1.0e-50),
])
def test_full_value_that_fits_gives_numpy_s_full(dtype, value, client):
    graph = from_yaml(f"deepx: 1\nnodes:\n - {{id: h, op: full, shape: [3], dtype: {dtype}, "
                      f"attrs: {{value: {value}}}}}\noutputs: [h]\n")
    (out,) = dx.run(graph, client=client).values()
    py = {".inf": math.inf, ".nan": math.nan}.get(value, value)
    np.testing.assert_array_equal(out, np.full(3, py, dtype=dtype))
    assert out.dtype == dtype


def test_sdk_scalars_that_do_not_fit_are_refused():
    x = dx.input("x", (3,), "float16")
    with pytest.raises(GraphError, match="fit"):
        x + 1e300


@pytest.mark.parametrize("node,words", [
    ("{id: h, op: arange, shape: [300], dtype: int8}", ["299", "int8"]),
    ("{id: h, op: arange, shape: [3], dtype: uint8, attrs: {start: 1, step: -1}}", ["-1"]),
    ("{id: h, op: arange, shape: [70000], dtype: float16}", ["69999", "float16"]),
    ("{id: h, op: arange, shape: [3], dtype: float32, attrs: {start: .nan}}", ["finite"]),
    ("{id: h, op: arange, shape: [3], dtype: float32, attrs: {step: .inf}}", ["finite"]),
    ("{id: h, op: arange, shape: [3], dtype: int64, attrs: {step: 0}}", ["step"]),
    ("{id: h, op: arange, shape: [3], dtype: int64, attrs: {start: true}}", ["number"]),
])
def test_arange_values_are_checked(node, words):
    refused(f"deepx: 1\nnodes:\n - {node}\noutputs: [h]\n", "node 'h'", *words)


def test_arange_at_the_edge_of_its_dtype_matches_numpy(client):
    graph = from_yaml("deepx: 1\nnodes:\n - {id: h, op: arange, shape: [256], dtype: uint8}\n"
                      " - {id: g, op: arange, shape: [5], dtype: int8, attrs: {start: 127,"
                      " step: -63}}\noutputs: [h, g]\n")
    out = dx.run(graph, client=client)
    np.testing.assert_array_equal(out["h"], np.arange(256, dtype="uint8"))
    np.testing.assert_array_equal(out["g"], np.arange(127, -126, -63).astype("int8"))
    assert out["g"].min() == -125


# -- random parameters ---------------------------------------------------------------------
@pytest.mark.parametrize("op,attrs,words", [
    ("random_normal", "std: .nan", ["std", "finite"]),
    ("random_normal", "mean: -.inf", ["mean", "finite"]),
    ("random_normal", "std: -1.0", ["std", ">= 0"]),
    ("random_normal", "std: abc", ["std", "number"]),
    ("random_normal", "mean: true", ["mean", "number"]),
    ("random_uniform", "low: 2.0, high: 1.0", ["low", "high"]),
    ("random_uniform", "low: 1.0, high: 1.0", ["low", "high"]),
    ("random_uniform", "low: .nan", ["low", "finite"]),
    ("random_uniform", "high: [1]", ["high", "number"]),
])
def test_random_parameters_are_checked(op, attrs, words):
    refused(f"deepx: 1\nnodes:\n - {{id: h, op: {op}, shape: [3], dtype: float32, "
            f"attrs: {{seed: 0, {attrs}}}}}\noutputs: [h]\n", "node 'h'", *words)


def test_a_uniform_range_without_a_value_of_the_dtype_is_refused():
    # No float16 lies in [1.0001, 1.0002) (float16 steps by 2**-10 there): the kernel used to
    # find out on a worker.
    refused("deepx: 1\nnodes:\n - {id: h, op: random_uniform, shape: [3], dtype: float16, "
            "attrs: {seed: 0, low: 1.0001, high: 1.0002}}\noutputs: [h]\n", "node 'h'",
            "float16", "[1.0001, 1.0002)")


@pytest.mark.parametrize("make", [
    lambda: dx.random.normal((3,), std=float("nan")),
    lambda: dx.random.normal((3,), std=-2.0),
    lambda: dx.random.normal((3,), mean="abc"),
    lambda: dx.random.uniform((3,), low=2, high=1),
    lambda: dx.random.uniform((3,), low=float("-inf")),
    lambda: dx.random.uniform((3,), seed=-1),
    lambda: dx.random.uniform((3,), seed=1.5),
])
def test_random_parameters_are_checked_in_python(make):
    with pytest.raises(GraphError):
        make()


# -- fused programs ------------------------------------------------------------------------
FUSED = HEADER + "  w: {shape: [3], dtype: float32}\nnodes:\n - {id: h, op: fused, " \
                 "args: [x, w], shape: [4, 3], attrs: {program: PROGRAM}}\noutputs: [h]\n"
GOOD_PROGRAM = "[[mul, [[in, 0], [c, 2.0, float32]], float32], [add, [[t, 0], [in, 1]], float32]]"


def test_a_hand_written_fused_program_runs_like_numpy(client):
    graph = from_yaml(FUSED.replace("PROGRAM", GOOD_PROGRAM))
    x = np.arange(12, dtype="float32").reshape(4, 3)
    w = np.array([1, -2, 3], dtype="float32")
    (out,) = dx.run(graph, inputs={"x": x, "w": w}, client=client).values()
    np.testing.assert_array_equal(out, x.astype("float64") * 2 + w)


@pytest.mark.parametrize("program,words", [
    ("[[frob, [[in, 0]], float32]]", ["unknown", "frob"]),
    ("[[fused, [[in, 0]], float32]]", ["fused"]),
    ("[[sum, [[in, 0]], float32]]", ["elementwise", "sum"]),
    ("[[exp, [[in, 5]], float32]]", ["in", "5", "2 input"]),
    ("[[exp, [[t, 0]], float32]]", ["t", "earlier"]),
    ("[[exp, [[in, 0]], object]]", ["object"]),
    ("[[exp, [[in, 0]], 5]]", ["dtype"]),
    ("[[exp, [[in, 0]], float64]]", ["float64", "float32"]),
    ("[[add, [[in, 0]], float32]]", ["add", "2"]),
    ("[[add, [[in, 0], [c, 1000, int8]], float32]]", ["1000", "int8"]),
    ("[[exp, [[q, 0]], float32]]", ["argument"]),
    ("[[exp, [in, 0], float32]]", ["argument"]),
    ("[1, 2]", ["instruction"]),
    ("[]", ["non-empty"]),
    ("3", ["program"]),
    ("[[where, [[in, 0], [in, 0], [in, 1]], float32]]", ["bool"]),
])
def test_a_malformed_fused_program_is_refused(program, words):
    err = refused(FUSED.replace("PROGRAM", program), "node 'h'", *words)
    assert err.node == "h"


MATMUL = HEADER + "  w: {shape: [3, 2], dtype: float32}\nnodes:\n - {id: h, op: matmul, " \
                  "args: [x, w], attrs: {epilogue: PROGRAM}}\noutputs: [h]\n"
REDUCE = HEADER + "nodes:\n - {id: h, op: sum, args: [x, x], attrs: {axes: [1], " \
                  "prologue: PROGRAM}}\noutputs: [h]\n"


@pytest.mark.parametrize("template", [MATMUL, REDUCE])
@pytest.mark.parametrize("program,words", [
    ("[[frob]]", ["instruction"]),
    ("[[exp, [[in, 7]], float32]]", ["in", "7"]),
    ("3", ["list of instructions"]),
    ("[[exp, [[in, 0]], object]]", ["object"]),
])
def test_malformed_epilogues_and_prologues_are_refused(template, program, words):
    refused(template.replace("PROGRAM", program), "node 'h'", *words)


def test_epilogue_and_prologue_programs_run_like_numpy(client):
    graph = from_yaml(
        HEADER + "  w: {shape: [3, 2], dtype: float32}\nnodes:\n"
        " - {id: h, op: matmul, args: [x, w], attrs: {epilogue: [[relu, [[in, 0]], float32]]}}\n"
        " - {id: s, op: sum, args: [x, x], attrs: {axes: [1], prologue: "
        "[[mul, [[in, 0], [in, 1]], float32]]}}\noutputs: [h, s]\n")
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(4, 3)
    w = np.array([[1, -1], [2, 0], [-3, 1]], dtype="float32")
    out = dx.run(graph, inputs={"x": x, "w": w}, client=client)
    np.testing.assert_allclose(out["h"], np.maximum(x.astype("f8") @ w, 0), rtol=1e-6)
    np.testing.assert_allclose(out["s"], (x.astype("f8") ** 2).sum(axis=1), rtol=1e-6)


@pytest.mark.parametrize("path", ["mlp_forward", "layout", "attention", "column_stats",
                                  "elementwise_chain"])
def test_compiled_graphs_read_back_with_their_programs(path):
    # What the fuser writes is what the program rules accept: a compiled graph written as
    # YAML reads back equal.
    plan = dx.compile(from_yaml(f"graphs/{path}.yaml"), cluster=cluster_with_memory(2**30))
    assert any(n.op == "fused" or n.attr("epilogue") or n.attr("prologue")
               for n in plan.fused.nodes)
    assert from_yaml(to_yaml(plan.fused)) == plan.fused
