"""Matmul chains: the layers of an MLP run inside the last layer's tasks, a block of rows at a
time, and their activations are never stored.

The structural tests look at the lowered graph; the hypothesis test runs random chains over
random chunk grids in this process and compares them with the same graph in which every
layer is also an output (which keeps each a task of its own) and with NumPy in float64.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.ir.keys import node_of
from deepx_flow.compiler.inline import chained_matmuls
from deepx_flow.kernels import tasks
from tests.compiler.test_inline import MEMORIES, evaluate, lowered


def mlp(rng, rows, widths, bias=True):
    """Inputs and tensors of relu layers of `widths` (the last without relu)."""
    xv = rng.standard_normal((rows, widths[0]))
    x = dx.input("x", xv.shape, "float64")
    inputs, h, layers = {"x": xv}, x, []
    for i, (k, n) in enumerate(zip(widths, widths[1:])):
        w = rng.standard_normal((k, n)) / np.sqrt(k)
        inputs[f"w{i}"] = w
        h = h @ dx.input(f"w{i}", w.shape, "float64")
        if bias:
            inputs[f"b{i}"] = rng.standard_normal(n)
            h = h + dx.input(f"b{i}", (n,), "float64")
        if i < len(widths) - 2:
            h = dx.relu(h)
        layers.append(h)
    return inputs, layers


def numpy_mlp(inputs, widths, bias=True):
    h = inputs["x"]
    for i in range(len(widths) - 1):
        h = h @ inputs[f"w{i}"] + (inputs[f"b{i}"] if bias else 0.0)
        if i < len(widths) - 2:
            h = np.maximum(h, 0.0)
    return h


def test_the_hidden_layers_of_an_mlp_are_no_tasks_of_their_own():
    rng = np.random.default_rng(0)
    widths = (40, 30, 20, 5)
    inputs, layers = mlp(rng, 3000, widths)
    plan, low = lowered(layers[-1], 256 * 2**10, inputs)
    hidden = {t.node.id for t in layers[:-1]}
    assert set(chained_matmuls(plan.fused, plan.partition)) == hidden
    names = {node_of(k) for k in low.dsk if isinstance(k, tuple)}
    assert not names & hidden
    rows = len(plan.chunks["x"][0])
    assert rows > 1 and plan.stats().tasks == len(low.dsk)
    (got,) = evaluate(layers[-1], 256 * 2**10, inputs)
    np.testing.assert_allclose(got, numpy_mlp(inputs, widths), rtol=1e-12, atol=1e-12)


def test_what_is_not_chained():
    rng = np.random.default_rng(1)
    inputs, layers = mlp(rng, 500, (16, 12, 4))
    # A hidden layer that is also an output is stored.
    plan, _ = lowered(layers, 2**30, inputs)
    assert not chained_matmuls(plan.fused, plan.partition)
    # One read twice (a Gram matrix of the activations) or by two matmuls.
    h = layers[0]
    first = {k: v for k, v in inputs.items() if k in ("x", "w0", "b0")}
    for outputs in ([dx.transpose(h) @ h], [h @ dx.ones((12, 3), "float64"),
                                            h @ dx.ones((12, 2), "float64")]):
        plan, _ = lowered(outputs, 2**30, first)
        assert not chained_matmuls(plan.fused, plan.partition)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(widths=st.lists(st.integers(1, 24), min_size=3, max_size=5).map(tuple),
       rows=st.integers(1, 600), bias=st.booleans(), memory=st.sampled_from(MEMORIES),
       seed=st.integers(0, 2**20))
def test_chaining_does_not_change_results(widths, rows, bias, memory, seed):
    inputs, layers = mlp(np.random.default_rng(seed), rows, widths, bias)
    try:
        (got,) = evaluate(layers[-1], memory, inputs)
        stored = evaluate(layers, memory, inputs)[-1]  # every layer an output: no chain
    except dx.PlanError:
        return
    want = numpy_mlp(inputs, widths, bias)
    scale = max(1.0, float(np.abs(want).max(initial=0.0))) * max(widths)
    np.testing.assert_allclose(got, stored, rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_a_chain_in_blocks_of_rows_is_the_layers_one_after_the_other(block):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((301, 9)).astype(np.float32)
    w1, w2 = rng.standard_normal((9, 6)).astype(np.float32), \
        rng.standard_normal((6, 3)).astype(np.float32)
    full = rng.standard_normal((301, 6)).astype(np.float32)  # an epilogue operand per row
    b2 = rng.standard_normal(3).astype(np.float32)
    ep1 = (("add", (("in", 0), ("in", 1)), "float32"), ("relu", (("t", 0),), "float32"))
    ep2 = (("add", (("in", 0), ("in", 1)), "float32"),
           ("cast", (("t", 0),), "float64"))  # the last layer changes dtype
    stages = ((ep1, "float32", 1), (ep2, "float64", 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tasks, "CHAIN_BLOCK_ELEMENTS", block)
        got = tasks.matmul_chain(stages, (301, 3), [()] * 5, x, w1, full, w2, b2)
    h = tasks.matmul_chunk(ep1, (301, 6), "float32", [()] * 3, x, w1, full)
    want = tasks.matmul_chunk(ep2, (301, 3), "float64", [()] * 3, h, w2, b2)
    assert got.dtype == np.float64 and got.shape == (301, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ref = np.maximum(x.astype(np.float64) @ w1 + full, 0) @ w2 + b2
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
