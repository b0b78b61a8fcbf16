"""Programs made by the real fusion pass, evaluated by the kernels, against plain NumPy."""

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.compiler.fuse import fuse_elementwise
from deepx_flow.compiler.infer import infer_types
from deepx_flow.kernels import fused_cpu, fused_gpu


def _fused_graph(y):
    return fuse_elementwise(infer_types(dx.build_graph(y)))


def _run(g, data, run):
    """Evaluate a fused graph of inputs and fused nodes, node by node (nodes are in order)."""
    values = {}
    for n in g.nodes:
        if n.op == "input":
            values[n.id] = data[n.id]  # an input node's id is its name
        else:
            assert n.op == "fused", n.op
            values[n.id] = run(n.attr("program"), [values[i] for i in n.inputs], n.shape)
    return values[g.nodes[-1].id]


def _k(x):
    return np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_an_mlp_style_chain(dtype):
    x = dx.input("x", (64, 33), dtype)
    b = dx.input("b", (33,), dtype)
    h = dx.gelu(x * 2.0 + b)
    y = dx.where(h > 0.5, dx.sigmoid(h) - 1.0, dx.maximum(h, b) / 3.0)
    g = _fused_graph(y)
    # h has three users, all in the kernel of y: one kernel that computes h once
    assert [n.op for n in g.nodes].count("fused") == 1
    rng = np.random.default_rng(0)
    data = {"x": rng.uniform(-2, 2, (64, 33)).astype(dtype),
            "b": rng.uniform(-1, 1, (33,)).astype(dtype)}
    xx, bb = data["x"].astype(np.float64), data["b"].astype(np.float64)
    hh = 0.5 * (2 * xx + bb) * (1 + np.tanh(_k(2 * xx + bb)))
    want = np.where(hh > 0.5, 1 / (1 + np.exp(-hh)) - 1, np.maximum(hh, bb) / 3)
    tol = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
    # where() compares a rounded value with 0.5: ignore elements within rounding of it
    near = np.abs(hh - 0.5) < 10 * tol
    for run in (fused_cpu.evaluate, fused_cpu.evaluate_blocked):
        got = _run(g, data, run)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got.astype(np.float64)[~near], want[~near], rtol=tol,
                                   atol=tol)
    for n in g.nodes:
        if n.op == "fused":
            body = fused_gpu.kernel_source(n.attr("program"), [dtype] * len(n.inputs))[2]
            assert len(body.splitlines()) == len(n.attr("program")) + 1


def test_integer_program_with_true_division_and_a_cast():
    a = dx.input("a", (10,), "int32")
    b = dx.input("b", (10,), "int64")
    y = dx.cast(dx.div(a, b) + 1, "float32")
    g = _fused_graph(y)
    assert [n.op for n in g.nodes].count("fused") == 1
    data = {"a": np.arange(-5, 5, dtype=np.int32), "b": np.array([0, 1, 2, 3, 4] * 2)}
    with np.errstate(all="ignore"):
        want = (data["a"] / data["b"] + 1).astype(np.float32)
    for run in (fused_cpu.evaluate, fused_cpu.evaluate_numexpr, fused_cpu.evaluate_blocked):
        got = _run(g, data, run)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
