"""Batch chains that branch and join (`compiler/batch_chain.py`): a residual block with a
squeeze-and-excitation scale and hard-swish activations (MobileNetV3's) is one chain, one
task per chunk of images; a value read by two stages is not written over by the first; a
per-image operand from outside the chain (a mask, a skip connection) is read as its chunk.
Values are compared with NumPy in float64 on many chunk grids and block sizes.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler import batch_chain
from deepx_flow.compiler.batch_chain import batch_chains
from deepx_flow.ir import dtypes
from tests.compiler.test_inline import MEMORIES, evaluate, lowered
from tests.kernels.test_window import ref_conv


def _hard_sigmoid(v):
    return np.clip(v / 6 + 0.5, 0, 1)


def block(rng, n, c, size, expand, kernel, stride):
    """An inverted residual block in float64 (1x1 expansion, hard-swish, depthwise conv,
    relu, squeeze-and-excitation, 1x1 projection, the residual sum where the shapes allow),
    its inputs and the NumPy reference."""
    e = c * expand
    v = {"x": rng.standard_normal((n, c, size, size)),
         "w1": rng.standard_normal((e, c, 1, 1)) / np.sqrt(c), "b1": rng.standard_normal(e),
         "wd": rng.standard_normal((e, 1, kernel, kernel)) / kernel,
         "bd": rng.standard_normal(e),
         "ws": rng.standard_normal((max(1, e // 4), e, 1, 1)) / np.sqrt(e),
         "wx": rng.standard_normal((e, max(1, e // 4), 1, 1)),
         "w2": rng.standard_normal((c, e, 1, 1)) / np.sqrt(e)}
    t = {k: dx.input(k, a.shape, "float64") for k, a in v.items()}
    pad = kernel // 2
    h = dx.nn.hard_swish(dx.nn.conv(t["x"], t["w1"], t["b1"]))
    h = dx.nn.relu(dx.nn.conv(h, t["wd"], t["bd"], stride=stride, padding=pad, groups=e))
    s = h.mean(axis=(2, 3), keepdims=True)
    s = dx.nn.hard_sigmoid(dx.nn.conv(dx.nn.relu(dx.nn.conv(s, t["ws"])), t["wx"]),
                           alpha=1 / 6)
    out = dx.nn.conv(h * s, t["w2"])
    if stride == 1:
        out = out + t["x"]

    r = ref_conv(v["x"], v["w1"], (1, 1), (0,) * 4, (1, 1), 1) + v["b1"][:, None, None]
    r = r * _hard_sigmoid(r)
    r = np.maximum(ref_conv(r, v["wd"], (stride,) * 2, (pad,) * 4, (1, 1), e)
                   + v["bd"][:, None, None], 0)
    q = r.mean(axis=(2, 3), keepdims=True)
    q = np.maximum(ref_conv(q, v["ws"], (1, 1), (0,) * 4, (1, 1), 1), 0)
    q = _hard_sigmoid(ref_conv(q, v["wx"], (1, 1), (0,) * 4, (1, 1), 1))
    want = ref_conv(r * q, v["w2"], (1, 1), (0,) * 4, (1, 1), 1)
    if stride == 1:
        want = want + v["x"]
    return v, out, want


def test_a_residual_block_with_squeeze_excitation_is_one_chain():
    values, out, want = block(np.random.default_rng(0), 40, 4, 8, 3, 3, 1)
    plan, low = lowered(out, 4 * 2**20, values)
    chained = batch_chains(plan.fused, plan.partition)
    assert set(chained.values()) == {out.node.id}  # one chain, ending at the residual sum
    layers = {n.id for n in plan.fused.nodes if n.op in ("conv", "mean")}
    assert layers <= set(chained)
    members = batch_chain.stages(plan.fused[out.node.id], plan.fused, chained)
    # its task reads the images once, though the first conv and the sum both read them
    assert batch_chain.chain_inputs(members, plan.fused) == ["x"]
    key, _ = low.outputs[plan.graph.outputs[0][0]]
    chain_tasks = [k for k in low.dsk if isinstance(k, tuple) and k[0] == key]
    assert len(chain_tasks) == len(plan.chunks[out.node.id][0])
    assert _planned_tasks(plan, out) == len(chain_tasks)
    (got,) = evaluate(out, 4 * 2**20, values)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), c=st.integers(1, 4), size=st.integers(3, 9),
       expand=st.integers(1, 3), kernel=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2),
       memory=st.sampled_from(MEMORIES), seed=st.integers(0, 2**16))
def test_random_blocks_equal_numpy(n, c, size, expand, kernel, stride, memory, seed):
    values, out, want = block(np.random.default_rng(seed), n, c, size, expand, kernel, stride)
    (got,) = evaluate(out, memory, values)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_a_value_read_by_two_stages_is_not_written_over_by_the_first():
    rng = np.random.default_rng(4)
    v = {"x": rng.standard_normal((30, 2, 6, 6)), "w": rng.standard_normal((3, 2, 3, 3))}
    x, w = dx.input("x", v["x"].shape, "float64"), dx.input("w", v["w"].shape, "float64")
    h = dx.nn.conv(x, w)
    out = dx.nn.relu(h) + dx.exp(h) * 2.0  # the relu may not write over h: exp reads it after
    plan, _ = lowered(out, 2**30, v)
    assert set(batch_chains(plan.fused, plan.partition).values()) == {out.node.id}
    h_ref = ref_conv(v["x"], v["w"], (1, 1), (0,) * 4, (1, 1), 1)
    for memory in MEMORIES:
        (got,) = evaluate(out, memory, v)
        np.testing.assert_allclose(got, np.maximum(h_ref, 0) + np.exp(h_ref) * 2.0,
                                   rtol=1e-12)


@pytest.mark.parametrize("memory", MEMORIES)
def test_a_per_image_operand_from_outside_is_read_as_its_chunk(memory):
    rng = np.random.default_rng(5)
    v = {"x": rng.standard_normal((20, 2, 6, 6)), "w": rng.standard_normal((3, 2, 3, 3)),
         "m": rng.standard_normal((20, 3, 4, 4)), "s": rng.standard_normal((20, 3, 1, 1))}
    t = {k: dx.input(k, a.shape, "float64") for k, a in v.items()}
    out = dx.nn.max_pool(dx.nn.conv(t["x"], t["w"]) * t["m"] + t["s"], 2)
    plan, _ = lowered(out, memory, v)
    chained = batch_chains(plan.fused, plan.partition)
    if chained:  # (a budget too small for a block of one image leaves the layers apart)
        members = batch_chain.stages(plan.fused[out.node.id], plan.fused, chained)
        assert batch_chain.chain_inputs(members, plan.fused) == ["x", "m", "s"]
    c = ref_conv(v["x"], v["w"], (1, 1), (0,) * 4, (1, 1), 1) * v["m"] + v["s"]
    want = c.reshape(20, 3, 2, 2, 2, 2).max(axis=(3, 5))
    (got,) = evaluate(out, memory, v)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def _planned_tasks(plan, tensor) -> int:
    return next(n.tasks for n in plan.stats().nodes if n.node == tensor.node.id)


@pytest.mark.parametrize("memory", [2**30, 64 * 2**10])
def test_a_chain_may_end_in_a_global_pooling_and_the_plan_counts_its_tasks(memory):
    rng = np.random.default_rng(8)
    v = {"x": rng.standard_normal((60, 3, 8, 8)), "w": rng.standard_normal((5, 3, 3, 3))}
    x, w = dx.input("x", v["x"].shape, "float64"), dx.input("w", v["w"].shape, "float64")
    out = dx.nn.relu(dx.nn.conv(x, w, padding=1)).mean(axis=(2, 3), keepdims=True)
    plan, low = lowered(out, memory, v)
    assert set(batch_chains(plan.fused, plan.partition).values()) == {out.node.id}
    key, chunks = low.outputs[plan.graph.outputs[0][0]]
    assert _planned_tasks(plan, out) == len(chunks[0]) == len(
        [k for k in low.dsk if isinstance(k, tuple) and k[0] == key])
    want = np.maximum(ref_conv(v["x"], v["w"], (1, 1), (1,) * 4, (1, 1), 1), 0).mean(
        axis=(2, 3), keepdims=True)
    (got,) = evaluate(out, memory, v)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_reduction_stage_gives_the_bits_of_its_task_of_its_own():
    """A reduction stage computes what the reduction as its own task computes (float32
    means added up in float64, then divided and rounded), on blocks of images: chained and
    unchained, the same bits (a depthwise conv before it, whose sums do not depend on the
    block)."""
    rng = np.random.default_rng(6)
    values = {"x": rng.standard_normal((200, 6, 9, 9)).astype(np.float32),
              "w": rng.standard_normal((6, 1, 3, 3)).astype(np.float32)}
    x = dx.input("x", values["x"].shape, "float32")
    w = dx.input("w", values["w"].shape, "float32")
    h = dx.nn.conv(x, w, padding=1, groups=6)
    pooled = (h * h).mean(axis=(2, 3), keepdims=True)
    over_channels = h.max(axis=1, keepdims=True)  # along the channels: images first
    out = pooled * h + over_channels
    memory = 256 * 2**10
    plan, low = lowered(out, memory, values)
    chained = batch_chains(plan.fused, plan.partition)
    assert set(chained.values()) == {out.node.id}
    members = batch_chain.stages(plan.fused[out.node.id], plan.fused, chained)
    assert batch_chain.images_per_block(members, plan.fused, plan.partition) < 200  # blocks
    assert dtypes.accumulator("float32") == "float64"
    (got,) = evaluate(out, memory, values)
    *_, alone = evaluate([pooled, over_channels, h, out], memory, values)  # no chain
    np.testing.assert_array_equal(got, alone)
    hv = ref_conv(values["x"].astype(np.float64), values["w"].astype(np.float64), (1, 1),
                  (1,) * 4, (1, 1), 6)
    want = (hv * hv).mean(axis=(2, 3), keepdims=True) * hv + hv.max(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_reshape_sharing_bytes_with_a_value_keeps_it_from_being_written_over():
    """A flatten reads a value another stage reads after it: the later stage may not write
    its result over that value (the flatten's view shares its bytes) (review finding)."""
    rng = np.random.default_rng(7)
    v = {"x": rng.standard_normal((8, 2, 6, 6)), "w": rng.standard_normal((3, 2, 3, 3))}
    x, w = dx.input("x", v["x"].shape, "float64"), dx.input("w", v["w"].shape, "float64")
    s = dx.softmax(dx.nn.conv(x, w), axis=-1)  # laid out images first
    out = dx.reshape(s, (8, 48)) + dx.reshape(s * 2.0, (8, 48))
    plan, _ = lowered(out, 2**30, v)
    assert set(batch_chains(plan.fused, plan.partition).values()) == {out.node.id}
    c = ref_conv(v["x"], v["w"], (1, 1), (0,) * 4, (1, 1), 1)
    e = np.exp(c - c.max(axis=-1, keepdims=True))
    want = (3 * e / e.sum(axis=-1, keepdims=True)).reshape(8, 48)
    for memory in MEMORIES:
        (got,) = evaluate(out, memory, v)
        np.testing.assert_allclose(got, want, rtol=1e-12)
