"""Max pooling before the elementwise kernel it reads, where that gives the same numbers
exactly (`compiler/pool_first.py`; batch chains swap the two when they run).

Results are checked for equality (NaN where NaN; a zero's sign is max_pool's choice either
way) against NumPy computing the original order in the same dtype, on data full of ties,
infinities and NaN, biases among them.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.batch_chain import batch_chains, chain_operand
from deepx_flow.compiler.fuse import fuse_elementwise
from deepx_flow.compiler.infer import infer_types
from deepx_flow.compiler.pool_first import commuting_operands
from deepx_flow.compiler.validate import validate_graph
from deepx_flow.kernels.batch_chain import _pools_first
from tests.compiler.test_inline import evaluate, lowered
from tests.kernels.test_window import ref_pool

SHAPE = (6, 3, 8, 8)
X = dx.input("x", SHAPE, "float32")
B = dx.input("b", (3, 1, 1), "float32")

# (the kernel the pooling reads, its NumPy form in float32, the operands that must be finite)
EXACT = {
    "relu(x + b)": (lambda: dx.nn.relu(X + B), lambda x, b: np.maximum(x + b, 0), ("b",)),
    "x - b": (lambda: X - B, lambda x, b: x - b, ("b",)),
    "min(max(x, b), 6)": (lambda: dx.minimum(dx.maximum(X, B), 6.0),
                          lambda x, b: np.minimum(np.maximum(x, b), 6), ()),
    "x * 3 / 7": (lambda: X * 3.0 / 7.0, lambda x, b: x * np.float32(3) / np.float32(7), ()),
    "floor(relu(x)) - 1": (lambda: dx.floor(dx.nn.relu(X)) - 1.0,
                           lambda x, b: np.floor(np.maximum(x, 0)) - np.float32(1), ()),
}
NOT_EXACT = {
    "exp(x)": lambda: dx.exp(X),
    "tanh(x + b)": lambda: dx.tanh(X + B),
    "-x": lambda: -X,
    "b - x": lambda: B - X,
    "x * x": lambda: X * X,
    "x * b": lambda: X * B,
    "x * -2": lambda: X * -2.0,
    "x + inf": lambda: X + float("inf"),
    "relu(x) + x (both depend on x)": lambda: dx.nn.relu(X) + X,
    "x + exp(b) (a computed addend)": lambda: X + dx.exp(B),
    "x + y (y varies inside a window)": lambda: X + dx.input("y", (1, 1, 8, 8), "float32"),
    "int8 x + b (wraps around)": lambda: dx.input("i", SHAPE, "int8") + dx.input(
        "c", (3, 1, 1), "int8"),
}


def kernel_of(out):
    graph = fuse_elementwise(infer_types(validate_graph(dx.build_graph([out]))))
    kernel = graph[next(n for n in graph.nodes if n.op == "max_pool").inputs[0]]
    return kernel, graph


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_kernels_may_follow_the_pooling(name):
    build, _, finite = EXACT[name]
    kernel, graph = kernel_of(dx.nn.max_pool(build(), 2))
    at = chain_operand(kernel, graph)
    got = commuting_operands(kernel, at, graph)
    assert got is not None and tuple(kernel.inputs[p] for p in got) == finite


@pytest.mark.parametrize("name", sorted(NOT_EXACT))
def test_other_kernels_may_not(name):
    kernel, graph = kernel_of(dx.nn.max_pool(NOT_EXACT[name](), 2))
    at = chain_operand(kernel, graph)
    assert at is None or commuting_operands(kernel, at, graph) is None


def test_the_swap_waits_for_finite_operands():
    fused = ("fused", (), (1,))  # the images and a bias that must be finite
    pool = ("window", "max_pool", {"kernel": (2, 2)})
    relu = ("fused", (), None)
    stages = [(fused, (("image", 0), ("whole", 0))), (pool, (("stage", 0),)),
              (relu, (("stage", 1),))]
    for bias, swapped in ((np.ones(3), True), (np.array([1.0, np.inf, 0]), False),
                          (np.array([np.nan, 0, 0]), False)):
        got = _pools_first(list(stages), [bias], np)
        # swapped: the pooling reads the images, the kernel the pooling (and asks no more),
        # the relu the kernel, at the pooling's place
        assert got == ([(pool, (("image", 0),)),
                        (fused[:2] + (None,), (("stage", 0), ("whole", 0))),
                        (relu, (("stage", 1),))] if swapped else stages)
    # a pooling that does not read the kernel alone, or reads something else, stays
    other = [stages[0], (pool, (("image", 0),)), stages[2]]
    assert _pools_first(list(other), [np.ones(3)], np) == other


VALUES = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, -1e-45, 3.4e38, -3.4e38,
                          np.inf, -np.inf, np.nan, 2.0, 2.0000002])
FINITE = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 3.4e38, -3.4e38, 2.0])


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(EXACT)), data=st.data(), finite_bias=st.booleans(),
       kernel=st.integers(1, 3), stride=st.integers(1, 3), pad=st.integers(0, 1))
def test_results_are_those_of_the_original_order(name, data, finite_bias, kernel,
                                                             stride, pad):
    if pad >= kernel:
        return  # a window of padding only: refused by the operator
    build, numpy_form, _ = EXACT[name]
    x = np.asarray(data.draw(st.lists(VALUES, min_size=6 * 3 * 64, max_size=6 * 3 * 64)),
                   np.float32).reshape(SHAPE)
    b = np.asarray(data.draw(st.lists(FINITE if finite_bias else VALUES, min_size=3,
                                      max_size=3)), np.float32).reshape(3, 1, 1)
    out = dx.nn.max_pool(build(), kernel, stride=stride, padding=pad)
    names = {n.id for n in dx.build_graph([out]).inputs}
    inputs = {k: v for k, v in {"x": x, "b": b}.items() if k in names}
    plan, _ = lowered(out, 2**30, inputs)
    assert batch_chains(plan.fused, plan.partition)  # the pooling and its kernel: a chain
    (got,) = evaluate(out, 2**30, inputs)
    with np.errstate(all="ignore"):
        want = ref_pool("max_pool", numpy_form(x, b).astype(np.float32), (kernel,) * 2,
                        (stride,) * 2, (pad,) * 4, (1, 1)).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)  # NaN where NaN


def test_an_infinite_bias_keeps_the_original_order():
    # relu(-inf + inf) is NaN, so a window holding -inf and 1 has NaN for its maximum; the
    # pooling first would give relu(1 + inf) = inf
    x = np.ones(SHAPE, np.float32)
    x[:, :, 0, 0] = -np.inf
    b = np.array([np.inf, 1.0, -np.inf], np.float32).reshape(3, 1, 1)
    out = dx.nn.max_pool(dx.nn.relu(X + B), 2)
    (got,) = evaluate(out, 2**30, {"x": x, "b": b})
    with np.errstate(invalid="ignore"):
        want = ref_pool("max_pool", np.maximum(x + b, 0), (2, 2), (2, 2), (0,) * 4, (1, 1))
    assert np.isnan(want[:, 0, 0, 0]).all() and np.isinf(want[:, 0, 1, 1]).all()
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_integer_sums_that_wrap_keep_the_original_order():
    # int8: 100 + 100 wraps to -56, so the maximum of a window holding 100 and 27 plus 100 is
    # 127 (27 + 100), not max(100, 27) + 100
    x = np.zeros(SHAPE, np.int8)
    x[:, :, 0, 0], x[:, :, 0, 1] = 100, 27
    b = np.full((3, 1, 1), 100, np.int8)
    i, c = dx.input("i", SHAPE, "int8"), dx.input("c", (3, 1, 1), "int8")
    (got,) = evaluate(dx.nn.max_pool(i + c, 2), 2**30, {"i": x, "c": b})
    assert (got[:, :, 0, 0] == 127).all()
