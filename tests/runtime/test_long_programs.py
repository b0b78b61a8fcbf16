"""Valid graphs compile and run whatever their length; outputs may name one tensor twice.

Each test here once failed: a chain of 497 elementwise operators overflowed Python's recursion
limit in the fusion pass; a max-pool written as 24 maxima made the CPU code generator build an
expression 4x longer per operator until it ran out of memory, which was then reported as data
running out of memory and planned again; `dx.run([x, x])` said "output name 'x' is used twice".
"""

import numpy as np
import pytest

import deepx_flow as dx
from tests.helpers import cluster_with_memory


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


# One step of the long chain: (what the graph does, what NumPy in float64 does). The mix keeps
# values in a bounded range (tanh, sigmoid, the clamps) so 10,000 steps neither overflow nor
# shrink to nothing, and reads the input again and again (a fused program with many reads).
STEPS = (
    (lambda y, x: y + x, lambda y, x: y + x),
    (lambda y, x: y * 0.75, lambda y, x: y * 0.75),
    (lambda y, x: dx.tanh(y), lambda y, x: np.tanh(y)),
    (lambda y, x: dx.maximum(y, x), lambda y, x: np.maximum(y, x)),
    (lambda y, x: y - 0.25, lambda y, x: y - 0.25),
    (lambda y, x: dx.sigmoid(y), lambda y, x: 1 / (1 + np.exp(-y))),
    (lambda y, x: dx.gelu(y), lambda y, x: gelu(y)),
    (lambda y, x: dx.minimum(y, x * 2.0), lambda y, x: np.minimum(y, x * 2.0)),
    (lambda y, x: dx.relu(y) - x, lambda y, x: np.maximum(y, 0) - x),
)


def chain(n, x):
    """The graph of an n-step chain, and the same chain in NumPy float64 on array `x`."""
    xt = dx.input("x", x.shape, "float64")
    y, want = xt, x.astype(np.float64)
    for i in range(n):
        graph_step, numpy_step = STEPS[i % len(STEPS)]
        y = graph_step(y, xt)
        want = numpy_step(want, x)
    return y, want


def test_a_chain_of_ten_thousand_operators_compiles_and_runs(client):
    x = np.random.default_rng(0).uniform(-2, 2, (7, 5))
    y, want = chain(10_000, x)
    plan = dx.compile(y, cluster=cluster_with_memory(2**30))
    fused = [n for n in plan.fused.nodes if n.op == "fused"]
    assert len(fused) == 1 and len(fused[0].attr("program")) >= 10_000
    got = dx.run(y, inputs={"x": x}, client=client)
    # Each step rounds once (a few ulp for tanh, sigmoid, gelu); the contracting steps keep
    # errors from growing along the chain, so the total stays far below 1e-10.
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_a_max_pool_written_as_24_maxima_runs(client):
    # a 5x5 max-pool (stride 1): the 25 shifted windows of x, folded with 24 maxima into one
    # fused program; its CPU code once grew 4x per maximum until the worker ran out of memory
    x = np.random.default_rng(1).standard_normal((40, 36)).astype(np.float32)
    x[3, 4] = np.nan  # NaN wins in NumPy's maximum, so every window holding it is NaN
    xt = dx.input("x", x.shape, "float32")
    h, w = x.shape[0] - 4, x.shape[1] - 4
    pooled = None
    for di in range(5):
        for dj in range(5):
            window = xt[di:di + h, dj:dj + w]
            pooled = window if pooled is None else dx.maximum(pooled, window)
    plan = dx.compile(pooled, cluster=cluster_with_memory(2**30))
    (kernel,) = [n for n in plan.fused.nodes if n.op == "fused"]
    assert [op for op, _, _ in kernel.attr("program")] == ["maximum"] * 24
    got = dx.run(pooled, inputs={"x": x}, client=client)
    want = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (5, 5)).max(
        axis=(2, 3))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.isnan(got[:4, :5]).all() and np.isnan(got).sum() == 20


def test_a_code_generation_failure_is_reported_as_such_and_not_planned_again(
        client, monkeypatch, caplog):
    # The numexpr generator's depth limit lifted past what Python's parser (which numexpr
    # compiles with) takes: the worker's compile of the generated code really fails. A
    # MemoryError there was once reported as "ran out of memory" and planned again twice.
    from deepx_flow.kernels import fused_numexpr
    monkeypatch.setattr(fused_numexpr, "MAX_EXPR_DEPTH", 10_000)
    monkeypatch.setattr(fused_numexpr, "MAX_EXPR_CHARS", 10**7)
    x = np.linspace(-1, 1, 12)
    xt = dx.input("x", x.shape, "float64")
    y = xt + 0.987654321  # a constant no other test uses, so no cached code is reused
    for i in range(299):  # float64 add/sub: the cost table picks numexpr
        y = y - xt if i % 2 else y + xt
    with caplog.at_level("WARNING"), pytest.raises(dx.ExecutionError) as info:
        dx.run(y, inputs={"x": x}, client=client)
    message = str(info.value)
    assert info.value.kind == "codegen"
    assert f"(node {y.node.id})" in message and "could not be generated or compiled" in message
    assert "SyntaxError" in message and "ran out of memory" not in message
    assert "planned again" not in caplog.text
