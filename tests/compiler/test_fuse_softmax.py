"""A softmax joins the kernel of its users: its values are never stored.

The structural tests look at the fused graph and the lowered tasks; the hypothesis test runs
random graphs around softmaxes over random chunk grids in this process (Dask's synchronous
scheduler) and compares them with the same graph in which every softmax is also an output
(which keeps it a node of its own) and with NumPy in float64.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.fuse import fuse_elementwise
from deepx_flow.compiler.infer import infer_types
from deepx_flow.compiler.validate import validate_graph
from deepx_flow.ir.program import whole_axes
from tests.compiler.test_inline import MEMORIES, evaluate, lowered, ops_left


def fused(outputs):
    g = fuse_elementwise(infer_types(dx.build_graph(outputs)))
    infer_types(validate_graph(g))  # the fused graph is itself a valid graph
    return g


def entropy(x, axis=1):
    return -(dx.softmax(x, axis=axis) * dx.log_softmax(x, axis=axis)).sum(axis=axis)


def np_log_softmax(z, axis):
    log_p = z - z.max(axis=axis, keepdims=True)
    return log_p - np.log(np.exp(log_p).sum(axis=axis, keepdims=True))


def test_the_entropy_of_a_softmax_is_one_reduction_that_stores_no_softmax(tmp_path):
    values = np.random.default_rng(0).standard_normal((3000, 40)) * 4
    np.save(tmp_path / "x.npy", values)
    x = dx.input("x", values.shape, "float64")
    g = fused(entropy(x))
    assert [n.op for n in g.nodes] == ["input", "sum", "fused"]
    program = g.nodes[1].attr("prologue")
    assert [op for op, _, _ in program] == ["softmax", "log_softmax", "mul"]
    assert whole_axes(program) == (1,) and g.nodes[1].inputs == ("x",)

    inputs = {"x": str(tmp_path / "x.npy")}
    plan, low = lowered(entropy(x), 64 * 2**10, inputs)
    assert len(plan.chunks["x"][0]) > 1 and plan.chunks["x"][1] == (40,)  # the axis whole
    assert {"softmax", "log_softmax", "x"}.isdisjoint(ops_left(low))  # read inside too
    (got,) = evaluate(entropy(x), 64 * 2**10, inputs)
    log_p = np_log_softmax(values, 1)
    np.testing.assert_allclose(got, -(np.exp(log_p) * log_p).sum(axis=1), rtol=1e-12,
                               atol=1e-12 * 40)


def test_a_softmax_stays_a_node_where_it_cannot_join():
    x = dx.input("x", (50, 8))
    column = dx.input("c", (50, 1))
    s = dx.softmax(x, axis=1)
    # An output, read by two kernels, and a softmax of a smaller shape than its user's
    # (normalized over its own axis of length 1, not over the broadcast one).
    cases = {"output": [s, s * 2.0], "two users": [s + 1.0, s * 2.0],
             "smaller": [dx.softmax(column, axis=1) * x]}
    for name, outputs in cases.items():
        ops = [n.op for n in fused(outputs).nodes]
        assert "softmax" in ops, name
    # Two axes in one kernel: the first (its users' side) joins, the second stays a node, so
    # no chunk has to keep both axes whole.
    g = fused(dx.softmax(x, axis=0) * dx.softmax(x, axis=1))
    assert [n.op for n in g.nodes].count("softmax") == 1
    assert whole_axes(g.nodes[-1].attr("program")) in ((0,), (1,))


def test_a_matmul_epilogue_takes_no_softmax():
    x, w = dx.input("x", (64, 32)), dx.input("w", (32, 10))
    y = dx.log_softmax(x @ w, axis=1) * 2.0
    g = fused(y)
    mm = next(n for n in g.nodes if n.op == "matmul")
    assert mm.attr("epilogue") is None
    assert whole_axes(g[y.node.id].attr("program")) == (1,)


def test_a_program_with_a_bad_whole_axis_is_refused():
    x = dx.input("x", (64, 32))
    g = fused(dx.softmax(x, axis=1) * 2.0)
    node = g[g.output_ids[0]]
    program = node.attr("program")
    bad_axis = ((program[0][0], (program[0][1][0], ("c", 2, "int64")), program[0][2]),) + \
        program[1:]
    with pytest.raises(dx.GraphError, match=r"softmax takes \[value, \[c, axis, int64\]\] "
                                            r"with an axis of the 2-D result"):
        infer_types(validate_graph(_with_program(g, node, bad_axis)))
    bad_dtype = ((program[0][0], program[0][1], "float64"),) + program[1:]
    with pytest.raises(dx.GraphError, match="softmax of float32 gives float32"):
        infer_types(validate_graph(_with_program(g, node, bad_dtype)))


def _with_program(g, node, program):
    from dataclasses import replace

    from deepx_flow.ir import Graph
    from deepx_flow.ir.node import make_attrs
    new = replace(node, attrs=make_attrs(program=program))
    return Graph(tuple(new if n.id == node.id else n for n in g.nodes), g.outputs)


# Random graphs: z = x * a + b (b a row or a column), one or two softmaxes of z along one
# axis, combined elementwise, then reduced along an axis or kept.
@st.composite
def softmax_graphs(draw):
    axis = draw(st.integers(0, 1))
    ops = draw(st.lists(st.sampled_from(["softmax", "log_softmax"]), min_size=1, max_size=2))
    combine = draw(st.sampled_from(["mul", "add", "exp"]))
    reduce = draw(st.sampled_from([None, 0, 1]))
    bias_axis = draw(st.integers(0, 1))
    return axis, ops, combine, reduce, bias_axis


def build(mod, x, bias, axis, ops, combine, reduce):
    """The graph's result and its softmax values."""
    if mod is np:
        z = x * 2.5 + bias
        values = [np.exp(np_log_softmax(z, axis)) if op == "softmax" else
                  np_log_softmax(z, axis) for op in ops]
    else:
        z = x * 2.5 + bias
        values = [getattr(dx, op)(z, axis=axis) for op in ops]
    y = values[0]
    for v in values[1:]:
        y = y * v if combine == "mul" else y + v
    if combine == "exp":
        y = mod.exp(y * 0.5)
    return (y if reduce is None else y.sum(axis=reduce)), values


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graph=softmax_graphs(), m=st.integers(1, 500), k=st.integers(1, 30),
       memory=st.sampled_from(MEMORIES), seed=st.integers(0, 2**20))
def test_fusing_softmaxes_does_not_change_results(graph, m, k, memory, seed):
    axis, ops, combine, reduce, bias_axis = graph
    rng = np.random.default_rng(seed)
    xv = rng.standard_normal((m, k)) * 3
    bv = rng.standard_normal((1, k) if bias_axis else (m, 1))
    x, b = dx.input("x", xv.shape, "float64"), dx.input("b", bv.shape, "float64")
    inputs = {"x": xv, "b": bv}
    y, softmaxes = build(dx, x, b, axis, ops, combine, reduce)
    # Every softmax also an output: then none is fused, each is a task of its own.
    kept = [y] + softmaxes
    if y.node.op not in ("softmax", "log_softmax"):  # read by a kernel: fused into it
        assert not {"softmax", "log_softmax"} & {n.op for n in fused(y).nodes}
    try:
        (got,) = evaluate(y, memory, inputs)
        plain = evaluate(kept, memory, inputs)[0]
    except dx.PlanError:
        return
    want = build(np, xv, bv, axis, ops, combine, reduce)[0]
    terms = max(m, k) * max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got, plain, rtol=0, atol=1e-12 * terms)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11 * terms)


def test_a_softmax_read_by_a_reduction_is_its_prologue():
    x = dx.input("x", (64, 32))
    y = dx.softmax(dx.log_softmax(x, axis=0), axis=1).max(axis=1)
    g = fused(y)
    red = g[y.node.id]
    assert [op for op, _, _ in red.attr("prologue")] == ["softmax"]
    assert whole_axes(red.attr("prologue")) == (1,)
    assert [n.op for n in g.nodes].count("log_softmax") == 1  # along another axis: a node


def test_a_graph_that_fits_with_its_softmaxes_unfused_is_not_refused_for_fusing_them():
    # Two softmaxes of one tensor along different axes, each read by a kernel: fused, both
    # axes of x would have to stay whole (more than the budget); the compiler fuses again
    # with the softmaxes as nodes of their own, which read x in pieces.
    from deepx_flow.compiler.compile import compile_graph
    from tests.helpers import cluster_with_memory
    x = dx.input("x", (1000, 1000))
    outputs = [dx.softmax(x, axis=0) * 2.0, dx.softmax(x, axis=1) * 3.0]
    plan = compile_graph(dx.build_graph(outputs), cluster_with_memory(16 * 2**20),
                         check=True)
    assert [n.op for n in plan.fused.nodes].count("softmax") == 2
    values = np.random.default_rng(1).standard_normal((1000, 1000)).astype(np.float32)
    got = evaluate(outputs, 16 * 2**20, {"x": values})
    for g, axis, k in zip(got, (0, 1), (2.0, 3.0)):
        np.testing.assert_allclose(g, np.exp(np_log_softmax(values.astype(np.float64), axis))
                                   * k, rtol=1e-5, atol=1e-8)
    # With room, they are fused.
    plan = compile_graph(dx.build_graph(outputs), cluster_with_memory(2**30), check=True)
    assert "softmax" not in [n.op for n in plan.fused.nodes]
