"""The fusion pass: which nodes fuse, and that nothing is fused across outputs or fan-out."""

import operator

import numpy as np
from hypothesis import example, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.fuse import fuse_elementwise
from deepx_flow.compiler.infer import infer_types
from deepx_flow.compiler.validate import validate_graph
from deepx_flow.ir.program import describe
from tests.compiler.test_inline import evaluate
from tests.helpers import cluster_with_memory


def fused(outputs):
    g = fuse_elementwise(infer_types(dx.build_graph(outputs)))
    infer_types(validate_graph(g))  # the fused graph is itself a valid graph
    return g


def test_chain_becomes_one_kernel():
    x = dx.input("x", (100, 10))
    y = dx.tanh(dx.exp(x * 2.0 + 1.0) - x) / 3.0
    g = fused(y)
    assert [n.op for n in g.nodes] == ["input", "fused"]
    program = g.nodes[1].attr("program")
    assert [op for op, _, _ in program] == ["mul", "add", "exp", "sub", "tanh", "div"]
    assert g.nodes[1].id == y.node.id  # the root keeps its id


def test_fan_out_and_outputs_are_not_fused_through():
    x = dx.input("x", (100, 10))
    shared = dx.exp(x)
    a, b = shared + 1.0, shared * 2.0
    g = fused([a, b])
    ops = [n.op for n in g.nodes]
    assert ops.count("fused") == 3  # shared stays a kernel of its own
    g2 = fused([shared, shared + 1.0])
    assert g2[shared.node.id].op == "fused"
    assert g2[(shared + 1.0).node.id].inputs == (shared.node.id,)


def test_matmul_epilogue_and_reduction_prologue():
    x = dx.input("x", (64, 32))
    w = dx.random.normal((32, 16), seed=1)
    b = dx.input("b", (16,))
    y = dx.relu(x @ w + b)
    z = dx.exp(x - 1.0).sum(axis=0)
    g = fused([y, z])
    mm = g[y.node.id]
    assert mm.op == "matmul" and mm.attr("epilogue") is not None
    assert mm.inputs == ("x", w.node.id, "b")
    red = g[z.node.id]
    assert red.op == "sum" and red.attr("prologue") is not None and red.inputs == ("x",)


def test_matmul_used_twice_keeps_its_result():
    x = dx.input("x", (64, 32))
    p = x @ dx.ones((32, 8))
    g = fused([p + 1.0, p * 2.0])
    assert g[p.node.id].op == "matmul" and g[p.node.id].attr("epilogue") is None


def test_a_chain_of_ten_thousand_operators_fuses_into_one_program():
    # 497 operators once overflowed Python's recursion limit while building the program
    x = dx.input("x", (6, 5), "float64")
    y = x
    for i in range(10_000):
        y = y * 1.0001 if i % 2 else y + x
    g = fused(y)
    assert [n.op for n in g.nodes] == ["input", "fused"]
    program = g[y.node.id].attr("program")
    assert len(program) == 10_000
    # operands come before their users, in the order the chain applies them
    assert [op for op, _, _ in program[:4]] == ["add", "mul", "add", "mul"]
    assert program[0][1] == (("in", 0), ("in", 0))
    assert all(args[0] == ("t", j) for j, (_, args, _) in enumerate(program[1:]))


def test_a_value_read_twice_is_one_instruction_read_twice():
    x = dx.input("x", (6, 5), "float64")
    t = dx.exp(x)
    y = t * t + t
    (program,) = [n.attr("program") for n in fused(y).nodes if n.op == "fused"]
    assert program == (("exp", (("in", 0),), "float64"),
                       ("mul", (("t", 0), ("t", 0)), "float64"),
                       ("add", (("t", 1), ("t", 0)), "float64"))


def test_explain_stays_short_for_long_programs_and_values_read_twice():
    from deepx_flow.ir.program import describe
    x = dx.input("x", (6, 5), "float64")
    t = x
    for _ in range(60):  # written out in full, this formula would double 60 times
        t = t * t + 1e-3
    y = x
    for i in range(10_000):
        y = y * 1.0001 if i % 2 else y + x
    plan = dx.compile([t, y], cluster=cluster_with_memory(2**30))
    table = plan.explain()
    for node in plan.fused.nodes:
        if node.op == "fused":
            program = node.attr("program")
            label = describe(program)
            assert label.endswith(f"... ({len(program):,} instructions)")
            assert len(label) < 250 and ("fused " + label) in table
    assert describe((("add", (("in", 0), ("c", 1.0, "float64")), "float64"),
                     ("relu", (("t", 0),), "float64"))) == "relu(add(in0, 1.0))"


def test_a_constant_is_shown_as_the_shortest_text_of_its_value_in_its_dtype():
    """Adam's `1 - beta1` folded into a float32 program is float32 0.1, and its label said
    mul(0.09999999999999998, ...): the float64 it was computed in."""
    from deepx_flow.ir.program import operator_label
    p = dx.input("p", (4, 3), "float32")
    g = dx.input("g", (4, 3), "float32")
    moment = 0.9 * p + (1 - 0.9) * g
    plan = dx.compile(moment, cluster=cluster_with_memory(2**30))
    (kernel,) = [n for n in plan.fused.nodes if n.op == "fused"]
    assert operator_label(kernel) == "fused[add(mul(0.9, in0), mul(0.1, in1))]"
    assert "mul(0.1, in1)" in plan.explain() and "0.0999" not in plan.explain()
    # In float64 that constant is not 0.1, and is shown as it is.
    double = dx.input("d", (4,), "float64") * (1 - 0.9)
    (kernel,) = dx.compile(double, cluster=cluster_with_memory(2**30)).fused.nodes[-1:]
    assert "0.09999999999999998" in operator_label(kernel)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, width=64),
       st.sampled_from(["float16", "bfloat16", "float32", "float64"]))
@example(1001.0, "float16")  # NumPy's str wrote "1.001e+03" (found by a run under load)
@example(65504.0, "float16")
@example(1e-300, "float64")
def test_a_constant_text_reads_back_as_the_same_value_of_its_dtype(value, dtype):
    from deepx_flow.ir.dtypes import BFLOAT16
    from deepx_flow.ir.program import constant_text
    kind = BFLOAT16.type if dtype == "bfloat16" else np.dtype(dtype).type
    with np.errstate(over="ignore"):
        typed = kind(value)
        text = constant_text(value, dtype)
        assert kind(float(text)) == typed or (np.isnan(typed) and text == "nan")
    # Never longer than the float64 text it was given (the dtype has fewer digits).
    assert len(text) <= max(len(repr(float(typed))), len(repr(value)))


def standardize(x):
    """A third moment: `x - mean` is read by two reductions' kernels."""
    centered = x - x.mean(axis=0)
    std = dx.sqrt((centered * centered).mean(axis=0))
    z = centered / std
    return centered, (z * z * z).mean(axis=0)


def test_a_cheap_operator_read_by_several_kernels_is_computed_in_each():
    x = dx.input("x", (1000, 16))
    centered, y = standardize(x)
    g = fused(y)
    assert centered.node.id not in {n.id for n in g.nodes}
    prologues = [n.attr("prologue") for n in g.nodes if n.attr("prologue")]
    assert len(prologues) == 2 and all(p[0][0] == "sub" for p in prologues)
    # x is stored for the first mean anyway; the mean is small: nothing more is read.
    assert all(n.inputs[:2] == ("x", g.nodes[1].id) for n in g.nodes if n.attr("prologue"))


def test_what_is_not_recomputed():
    x = dx.input("x", (1000, 16))
    shared = dx.exp(x)
    g = fused([shared * 2.0, shared + 1.0])
    assert g[shared.node.id].op == "fused"  # exp costs more than storing it
    d = x - dx.input("y", (1000, 16))       # its operands are read by nothing else
    g = fused([(d * d).sum(axis=0), (d * 3.0).sum(axis=0)])
    assert g[d.node.id].op == "fused"
    out = x + 1.0
    g = fused([out, out * 2.0, out * 3.0])  # an output is stored anyway
    assert g[out.node.id].op == "fused"


@settings(max_examples=30, deadline=None)
@given(op=st.sampled_from(["sub", "add", "mul", "div"]), users=st.integers(2, 3),
       reduce=st.booleans(), rows=st.integers(1, 300), memory=st.sampled_from(
           [2**30, 64 * 2**10, 16 * 2**10]), seed=st.integers(0, 2**20))
def test_recomputing_does_not_change_results(op, users, reduce, rows, memory, seed):
    rng = np.random.default_rng(seed)
    xv = rng.standard_normal((rows, 12)) + 3.0
    x = dx.input("x", xv.shape, "float64")
    m = x.mean(axis=0)
    shared = getattr(operator, {"sub": "sub", "add": "add", "mul": "mul",
                                "div": "truediv"}[op])(x, m)
    outs = [dx.tanh(shared * float(i + 1)) for i in range(users)]
    outs = [o.sum(axis=0) if reduce else o for o in outs] + [m]
    g = fused(outs)
    assert shared.node.id not in {n.id for n in g.nodes}
    got = evaluate(outs, memory, {"x": xv})
    stored = evaluate(outs + [shared], memory, {"x": xv})[:-1]  # shared as an output
    mv = xv.mean(axis=0)
    sv = {"sub": xv - mv, "add": xv + mv, "mul": xv * mv, "div": xv / mv}[op]
    want = [np.tanh(sv * (i + 1)) for i in range(users)]
    want = [w.sum(axis=0) if reduce else w for w in want] + [mv]
    for a, b, w in zip(got, stored, want):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13 * rows)
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12 * rows)


def _describe_in_full(program, max_chars):
    """`describe` as it was: every instruction's formula written, in order, each cut."""
    from deepx_flow.ir.program import constant_text
    exprs, cut = [], False
    for op, args, _ in program:
        parts = [f"in{a[1]}" if a[0] == "in" else exprs[a[1]] if a[0] == "t" else
                 constant_text(a[1], a[2]) for a in args]
        text = f"{op}({', '.join(parts)})"
        cut = len(text) > max_chars
        exprs.append(text[:max_chars - 3] + "..." if cut else text)
    return exprs[-1] + (f" ({len(program):,} instructions)" if cut else "")


@st.composite
def programs(draw):
    n = draw(st.integers(1, 40))
    program = []
    for i in range(n):
        refs = st.one_of(st.tuples(st.just("in"), st.integers(0, 3)),
                         st.tuples(st.just("c"), st.floats(-10, 10, width=32),
                                   st.just("float32")),
                         *([st.tuples(st.just("t"), st.integers(0, i - 1))] * 3 if i else []))
        program.append((draw(st.sampled_from(["ab", "add", "mul", "maximum"])),
                        tuple(draw(st.lists(refs, min_size=1, max_size=3))), "float32"))
    return tuple(program)


@given(programs(), st.integers(8, 80))
def test_describe_writes_only_what_its_cut_shows_and_the_same_text(program, max_chars):
    assert describe(program, max_chars) == _describe_in_full(program, max_chars)
