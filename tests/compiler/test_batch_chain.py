"""Batch chains: a convolutional network's layers run as one task per chunk of images, a block
of images at a time through every layer (`compiler/batch_chain.py`, `kernels/batch_chain.py`).

The structural tests look at the plan and the lowered graph; the others run chains on many
chunk grids and block sizes in this process and compare them with NumPy in float64, layer by
layer (`tests/kernels/test_window.py`'s loop references).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.ir.keys import node_of
from deepx_flow.compiler import batch_chain
from deepx_flow.compiler.batch_chain import batch_chains
from deepx_flow.errors import PlanError
from deepx_flow.kernels import window
from tests.compiler.test_inline import MEMORIES, evaluate, lowered
from tests.kernels.test_window import ref_conv, ref_pool


def cnn(rng, n, size=12):
    """A conv net in float64 (conv+bias+relu, max_pool, strided grouped conv, avg_pool,
    flatten, matmul+bias, softmax), its inputs, and the NumPy float64 reference."""
    values = {"x": rng.standard_normal((n, 3, size, size)),
              "w1": rng.standard_normal((8, 3, 3, 3)) / 5, "b1": rng.standard_normal(8),
              "w2": rng.standard_normal((6, 4, 3, 3)) / 5, "b2": rng.standard_normal(6)}
    t = {k: dx.input(k, v.shape, "float64") for k, v in values.items()}
    h = dx.nn.relu(dx.nn.conv(t["x"], t["w1"], t["b1"], padding=1))
    h = dx.nn.max_pool(h, 2, stride=2)
    h = dx.nn.relu(dx.nn.conv(h, t["w2"], t["b2"], stride=2, padding=1, groups=2))
    h = dx.nn.avg_pool(h, 2, stride=1)
    features = h.shape[1] * h.shape[2] * h.shape[3]
    values["w3"] = rng.standard_normal((features, 5)) / np.sqrt(features)
    t["w3"] = dx.input("w3", values["w3"].shape, "float64")
    logits = dx.reshape(h, (n, features)) @ t["w3"]
    out = dx.softmax(logits, axis=1)

    v = values
    r = np.maximum(ref_conv(v["x"], v["w1"], (1, 1), (1, 1, 1, 1), (1, 1), 1)
                   + v["b1"][:, None, None], 0)
    r = ref_pool("max_pool", r, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1))
    r = np.maximum(ref_conv(r, v["w2"], (2, 2), (1, 1, 1, 1), (1, 1), 2)
                   + v["b2"][:, None, None], 0)
    r = ref_pool("avg_pool", r, (2, 2), (1, 1), (0, 0, 0, 0), (1, 1))
    z = r.reshape(n, -1) @ v["w3"]
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return values, out, z / z.sum(axis=1, keepdims=True)


def test_a_conv_nets_layers_are_one_task_per_chunk_of_images():
    values, out, want = cnn(np.random.default_rng(0), 300)
    plan, low = lowered(out, 4 * 2**20, values)
    chained = batch_chains(plan.fused, plan.partition)
    ends = set(chained.values())
    assert ends == {out.node.id}  # one chain, ending at the softmax
    layers = {n.id for n in plan.fused.nodes if n.op in ("conv", "max_pool", "avg_pool")}
    assert layers <= set(chained)
    batches = plan.chunks[out.node.id][0]
    assert len(batches) > 1  # several chunks, each of several blocks (see the next test)
    computed = {node_of(k) for k in low.dsk if isinstance(k, tuple)}
    assert not computed & set(chained)
    assert sum(1 for k in low.dsk if isinstance(k, tuple)
               and node_of(k) == out.node.id) == len(batches)
    assert plan.stats().tasks == len(low.dsk)
    (got,) = evaluate(out, 4 * 2**20, values)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_a_chunk_runs_in_blocks_with_a_ragged_last_block():
    values, out, want = cnn(np.random.default_rng(1), 250)
    plan, _ = lowered(out, 2**30, values)
    assert plan.chunks[out.node.id][0] == (250,)  # one chunk ...
    stages = batch_chain.stages(out.node, plan.fused, batch_chains(plan.fused, plan.partition))
    block = batch_chain.images_per_block(stages, plan.fused, plan.partition)
    image_bytes = 8 * 12 * 12 * 8  # ... of blocks of the first conv's activations
    assert block == batch_chain.BLOCK_BYTES // image_bytes and 250 % block
    (got,) = evaluate(out, 2**30, values)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_what_is_not_chained():
    rng = np.random.default_rng(2)
    xv, wv = rng.standard_normal((20, 2, 6, 6)), rng.standard_normal((3, 2, 3, 3))
    x, w = dx.input("x", xv.shape, "float64"), dx.input("w", wv.shape, "float64")
    inputs = {"x": xv, "w": wv}
    c = dx.nn.conv(x, w)
    # an output in the middle, a node read by two chains (two outputs)
    for outputs in ([c, dx.nn.relu(c)], [dx.nn.max_pool(c, 2), dx.nn.avg_pool(c, 2)]):
        plan, _ = lowered(outputs, 2**30, inputs)
        assert not batch_chains(plan.fused, plan.partition), outputs
    # a softmax over the images axis reads every image: the chain ends before it
    out = dx.softmax(dx.nn.relu(c), axis=0)
    plan, _ = lowered([out], 2**30, inputs)
    chained = batch_chains(plan.fused, plan.partition)
    assert chained and out.node.id not in set(chained) | set(chained.values())
    # ... and elementwise and matmul layers alone are no batch chain (an MLP is a matmul
    # chain, `compiler.inline.chained_matmuls`)
    plan, _ = lowered([dx.nn.relu(dx.reshape(x, (20, 72)) @ dx.ones((72, 4), "float64"))],
                      2**30, {"x": xv})
    assert not batch_chains(plan.fused, plan.partition)


def test_conv_reads_and_writes_channels_first():
    rng = np.random.default_rng(3)
    for groups, n in ((1, 5), (2, 70), (4, 130)):  # one block, and more than one
        x = rng.standard_normal((n, 4, 7, 6)).astype(np.float32)
        w = rng.standard_normal((8, 4 // groups, 3, 2)).astype(np.float32)
        attrs = {"strides": (2, 1), "pads": (1, 0, 1, 1), "groups": groups}
        want = window.conv(x, w, attrs)
        cn = np.ascontiguousarray(np.moveaxis(x, 0, 1))
        for channels_first, out_first in ((True, True), (False, True), (True, False)):
            got = window.conv(cn if channels_first else x, w, attrs, {}, channels_first,
                              out_channels_first=out_first)
            np.testing.assert_array_equal(np.moveaxis(got, 0, 1) if out_first else got, want)


@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), (1,), ()])
def test_elementwise_operands_broadcast_in_the_channels_first_layout(shape):
    rng = np.random.default_rng(4)
    xv, wv = rng.standard_normal((50, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    bv = rng.standard_normal(shape)
    x, w = dx.input("x", xv.shape, "float64"), dx.input("w", wv.shape, "float64")
    b = dx.input("b", shape, "float64")
    out = dx.nn.avg_pool(dx.tanh(dx.nn.conv(x, w, padding=1) * b), 2)
    plan, _ = lowered(out, 2**30, {"x": xv, "w": wv, "b": bv})
    assert batch_chains(plan.fused, plan.partition)
    (got,) = evaluate(out, 2**30, {"x": xv, "w": wv, "b": bv})
    c = ref_conv(xv, wv, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    want = ref_pool("avg_pool", np.tanh(c * bv), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 120), channels=st.sampled_from([1, 2, 4]), size=st.integers(3, 9),
       kernel=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
       dilation=st.integers(1, 2), depthwise=st.booleans(),
       pool=st.sampled_from([None, "max_pool", "avg_pool"]), bias=st.booleans(),
       memory=st.sampled_from(MEMORIES[:3]), seed=st.integers(0, 2**20))  # an image fits
def test_random_chains_equal_numpy(n, channels, size, kernel, stride, pad, dilation,
                                   depthwise, pool, bias, memory, seed):
    if dilation * (kernel - 1) + 1 > size + 2 * pad:
        return  # the window does not fit
    rng = np.random.default_rng(seed)
    groups = channels if depthwise else 1
    filters = channels * 2
    xv = rng.standard_normal((n, channels, size, size))
    wv = rng.standard_normal((filters, channels // groups, kernel, kernel))
    bv = rng.standard_normal(filters)
    x, w = dx.input("x", xv.shape, "float64"), dx.input("w", wv.shape, "float64")
    b = dx.input("b", bv.shape, "float64") if bias else None
    h = dx.nn.relu(dx.nn.conv(x, w, b, stride=stride, padding=pad, dilation=dilation,
                              groups=groups))
    r = ref_conv(xv, wv, (stride,) * 2, (pad,) * 4, (dilation,) * 2, groups)
    r = np.maximum(r + (bv[:, None, None] if bias else 0.0), 0)
    if pool and min(r.shape[2:]) >= 2:
        h = getattr(dx.nn, pool)(h, 2, stride=1)
        r = ref_pool(pool, r, (2, 2), (1, 1), (0, 0, 0, 0), (1, 1))
    features = int(np.prod(r.shape[1:]))
    w2v = rng.standard_normal((features, 3))
    out = dx.reshape(h, (n, features)) @ dx.input("w2", w2v.shape, "float64")
    inputs = {"x": xv, "w": wv, "w2": w2v, **({"b": bv} if bias else {})}
    try:
        plan, _ = lowered(out, memory, inputs)
    except PlanError:
        assume(False)  # one image does not fit a task of this budget: refused, by name
    if memory == 2**30:
        assert batch_chains(plan.fused, plan.partition)
    (got,) = evaluate(out, memory, inputs)
    want = r.reshape(n, -1) @ w2v
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def test_layers_whose_chain_would_not_fit_a_task_are_tasks_of_their_own():
    # A 4x4 pooling that shrinks the images 16 times, then a 1x1 conv that widens them 16
    # times: each fits a task alone, but a chain of both holds the chunk of images and the
    # equally large result at once. (A budget between the two, on the partition of one
    # chunk: the partitioner itself splits such chunks further, for parallelism.)
    from dataclasses import replace
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((64, 4, 16, 16))
    wv = rng.standard_normal((64, 4, 1, 1))
    x, w = dx.input("x", xv.shape, "float64"), dx.input("w", wv.shape, "float64")
    out = dx.nn.relu(dx.nn.conv(dx.nn.avg_pool(x, 4), w))
    plan, _ = lowered(out, 2**30, {"x": xv, "w": wv})
    graph, part = plan.fused, plan.partition
    pool = next(n for n in graph.nodes if n.op == "avg_pool")
    conv = next(n for n in graph.nodes if n.op == "conv")
    whole = [pool, conv, graph[out.node.id]]
    assert batch_chains(graph, part) == {pool.id: out.node.id, conv.id: out.node.id}
    x_bytes = out_bytes = 64 * 4 * 16 * 16 * 8
    tight = replace(part, budget=x_bytes + out_bytes)  # the chunks alone, no room for a block
    assert batch_chain.images_per_block(whole, graph, tight) is None
    assert batch_chains(graph, tight) == {conv.id: out.node.id}
    roomy = replace(part, budget=x_bytes + out_bytes + 2**20)
    assert batch_chains(graph, roomy) == batch_chains(graph, part)
    assert batch_chain.working_set(whole, graph, roomy) <= roomy.budget


@pytest.mark.parametrize("axis, n", [(1, 4), (0, 100)])
def test_a_softmax_fused_into_an_elementwise_kernel_ends_the_chain(axis, n):
    # softmax(h) * 2 is one fused kernel normalizing along an axis: across the images (axis
    # 0), or across the channels, laid out channels first inside a chain: no chain member.
    rng = np.random.default_rng(6)
    xv, wv = rng.standard_normal((n, 2, 6, 6)), rng.standard_normal((3, 2, 3, 3))
    x, w = dx.input("x", xv.shape, "float64"), dx.input("w", wv.shape, "float64")
    out = dx.nn.max_pool(dx.softmax(dx.nn.conv(x, w), axis=axis) * 2.0, 2)
    plan, _ = lowered(out, 2**30, {"x": xv, "w": wv})
    fused = next(n for n in plan.fused.nodes if n.op == "fused")
    chained = batch_chains(plan.fused, plan.partition)
    assert fused.id not in set(chained) | set(chained.values())
    (got,) = evaluate(out, 2**30, {"x": xv, "w": wv})
    c = ref_conv(xv, wv, (1, 1), (0,) * 4, (1, 1), 1)
    e = np.exp(c - c.max(axis=axis, keepdims=True))
    want = ref_pool("max_pool", 2.0 * e / e.sum(axis=axis, keepdims=True), (2, 2), (2, 2),
                    (0,) * 4, (1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
