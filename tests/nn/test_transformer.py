"""Causal attention in blocks and the decoder-only language model (`nn/attention.py`,
`nn/transformer.py`): equal to NumPy in float64, forward and gradient, and no node of the
forward or backward graph as large as a sequence-by-sequence matrix."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.errors import GraphError

REFERENCE = Path(__file__).resolve().parents[2] / "examples" / "tiny_lm_numpy.py"


def reference():
    spec = importlib.util.spec_from_file_location("tiny_lm_numpy", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention(q, k, v):
    t = q.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), length=st.integers(1, 24),
       d=st.integers(1, 6), dv=st.integers(1, 5), block=st.integers(1, 30),
       seed=st.integers(0, 2**31))
def test_blocked_attention_equals_softmax_attention(lead, length, d, dv, block, seed):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((*lead, length, d)) * 3 for _ in range(2))
    v = rng.standard_normal((*lead, length, dv))
    got = dx.run(dx.nn.causal_attention(q, k, v, block=block))
    np.testing.assert_allclose(got, attention(q, k, v), rtol=1e-12, atol=1e-12)


def test_its_gradient_equals_the_softmax_attentions_and_no_node_is_sequence_squared():
    rng = np.random.default_rng(0)
    length, block = 32, 8
    arrays = [rng.standard_normal((2, length, 4)) for _ in range(3)]
    q, k, v = (dx.input(n, (2, length, 4), "float64") for n in "qkv")
    weights = rng.standard_normal((2, length, 4))
    loss = (dx.nn.causal_attention(q, k, v, block=block) * weights).sum()
    grads = dx.grad(loss, [q, k, v])
    got = dx.run(grads, inputs=dict(zip("qkv", arrays)))
    # the reference gradient: central differences of the float64 reference
    f = lambda a: (attention(*a) * weights).sum()
    for i, g in enumerate(got):
        probe = np.zeros_like(arrays[i])
        for index in [(0, 0, 0), (1, 31, 3), (0, 17, 2), (1, 8, 1)]:
            probe[...] = 0
            probe[index] = 1e-6
            plus = [a + probe if j == i else a for j, a in enumerate(arrays)]
            minus = [a - probe if j == i else a for j, a in enumerate(arrays)]
            assert g[index] == pytest.approx((f(plus) - f(minus)) / 2e-6, rel=1e-6, abs=1e-8)
    graph = dx.build_graph(grads)
    assert max(math.prod(n.shape[-2:]) for n in graph.nodes if len(n.shape) >= 2) <= \
        max(block * block, length * 4)
    assert not [n for n in graph.nodes if n.shape[-2:] == (length, length)]


def test_a_language_model_s_loss_and_gradients_equal_numpy_in_float64():
    ref = reference()
    model = dx.nn.TransformerLM(vocab=13, length=12, dim=8, heads=2, layers=2, block=5,
                                dtype="float64")
    rng = np.random.default_rng(3)
    start = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in dx.run(model.init(0)).items()}
    tokens = rng.integers(0, 13, (3, 12))
    targets = rng.integers(0, 13, (3, 12))
    params = {k: dx.input("p_" + k.replace(".", "_"), v.shape, "float64")
              for k, v in start.items()}
    loss = model.loss(params, tokens, targets)
    grads = dx.grad(loss, list(params.values()))
    inputs = {t.node.id: start[k] for k, t in params.items()}
    got_loss, *got = dx.run([loss, *grads], inputs=inputs)
    want_loss, want = ref.loss_and_grads(start, tokens, targets, layers=2, heads=2)
    assert got_loss == pytest.approx(want_loss, rel=1e-12)
    for name, g in zip(params, got):
        scale = np.abs(want[name]).max() + 1e-12
        np.testing.assert_allclose(g, want[name], rtol=1e-9, atol=1e-12 * scale,
                                   err_msg=name)


def test_tied_weights_are_one_parameter_used_twice():
    model = dx.nn.TransformerLM(vocab=7, length=4, dim=4, heads=1, layers=1, block=2)
    names = set(model.shapes())
    assert "tokens" in names and not any("unembed" in n or "head" in n for n in names)
    graph = dx.build_graph(model(model.init(0), np.zeros((1, 4), np.int64)))
    (table,) = [n for n in graph.nodes if n.op == "random_normal" and n.shape == (7, 4)]
    readers = {graph[u].op for u in graph.consumers()[table.id]}
    assert readers == {"take", "transpose"}  # looked up, and the output projection


def test_wrong_shapes_and_sizes_are_graph_errors():
    with pytest.raises(GraphError, match="one shape"):
        dx.nn.causal_attention(np.zeros((4, 3)), np.zeros((5, 3)), np.zeros((4, 3)))
    with pytest.raises(GraphError, match="block is a positive"):
        dx.nn.causal_attention(np.zeros((4, 3)), np.zeros((4, 3)), np.zeros((4, 3)), block=0)
    with pytest.raises(GraphError, match="at least one position and one feature"):
        dx.nn.causal_attention(np.zeros((4, 0)), np.zeros((4, 0)), np.zeros((4, 3)))
    with pytest.raises(GraphError, match="at least one position"):
        dx.nn.causal_attention(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(GraphError, match="hidden must be a positive integer"):
        dx.nn.TransformerLM(vocab=5, length=4, dim=4, heads=2, layers=1, hidden=0)
    with pytest.raises(GraphError, match="multiple of heads"):
        dx.nn.TransformerLM(vocab=5, length=4, dim=6, heads=4, layers=1)
    model = dx.nn.TransformerLM(vocab=5, length=4, dim=4, heads=2, layers=1)
    with pytest.raises(GraphError, match="sequence <= 4"):
        model(model.init(0), np.zeros((1, 5), np.int64))
