"""The `differentiate` pass: gradients equal central finite differences in float64.

Each case weights an operator's result by a random cotangent `r` and sums it, so the whole
vector-Jacobian product is checked, not only its sum. The gradients are computed by the engine
under three chunk grids (one chunk, a few, one element or two per chunk) and compared with
central differences of the graph evaluated by NumPy (`tests.reference`), element by element.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.differentiate import differentiate
from deepx_flow.compiler.fuse import fuse_elementwise
from tests.helpers import cluster_with_memory
from tests.reference import evaluate

# Budgets that give one chunk, a few, and chunks of one or two elements to these small
# tensors (a grid that cannot fit is skipped; every case runs on at least two).
BUDGETS = (2**30, 2048, 1024, 300)


def finite_differences(loss: dx.Tensor, values: dict[str, np.ndarray], name: str,
                       h: float = 1e-6) -> np.ndarray:
    """d loss / d values[name] by central differences of the NumPy evaluation."""
    graph = dx.build_graph({"loss": loss})
    x = values[name]
    out = np.empty_like(x)
    for i in np.ndindex(x.shape):
        step = h * max(1.0, abs(x[i]))
        hi, lo = x.copy(), x.copy()
        hi[i] += step
        lo[i] -= step
        f_hi = evaluate(graph, {**values, name: hi})["loss"]
        f_lo = evaluate(graph, {**values, name: lo})["loss"]
        out[i] = (f_hi - f_lo) / (2 * step)
    return out


def check_gradients(client, build, specs: dict, seed: int = 0, budgets=BUDGETS,
                    wrt: tuple[str, ...] | None = None, extra: dict | None = None,
                    min_grids: int = 2) -> int:
    """Build `build(**tensors)` over float64 inputs drawn per `specs` (name -> (shape, low,
    high)), weight it by a random cotangent, and compare the engine's gradients with
    finite differences under each budget that can plan it (at least `min_grids` of them).
    `extra` gives values of other inputs `build` makes itself (labels). Returns how many
    budgets ran."""
    rng = np.random.default_rng(seed)
    values = {n: rng.uniform(lo, hi, size=shape) for n, (shape, lo, hi) in specs.items()}
    values.update(extra or {})
    tensors = {n: dx.input(n, shape, "float64") for n, (shape, _, _) in specs.items()}
    y = build(**tensors)
    values["r"] = rng.uniform(-1, 1, size=y.shape)
    loss = (y * dx.input("r", y.shape, "float64")).sum()
    used = {n.id for n in dx.build_graph(loss).inputs}
    names = wrt or tuple(n for n in specs if n in used)
    grads = dx.grad(loss, [tensors[n] for n in names])
    expected = [finite_differences(loss, values, n) for n in names]
    ran = 0
    for memory in budgets:
        spec = cluster_with_memory(memory)
        try:
            compile_graph(dx.build_graph(grads), spec)
        except dx.PlanError:
            continue
        needed = {n.id for n in dx.build_graph(grads).inputs}
        got = dx.run(grads, inputs={k: v for k, v in values.items() if k in needed},
                     client=client, cluster=spec)
        ran += 1
        for n, g, e in zip(names, got, expected):
            assert g.shape == values[n].shape and g.dtype == np.float64
            scale = 1.0 + np.abs(e).max()
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6 * scale,
                                       err_msg=f"d/d{n} with budget {memory}")
    assert ran >= min_grids, f"the case ran under fewer than {min_grids} chunk grids"
    return ran


SHAPE = (5, 6)
ANY = (SHAPE, -2.0, 2.0)
POSITIVE = (SHAPE, 0.3, 2.0)

UNARY = ["neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu", "erf", "sin", "cos",
         "softplus", "sinh", "cosh", "asinh"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(client, op):
    check_gradients(client, lambda x: getattr(dx, op)(x), {"x": ANY})


def test_tan_away_from_its_poles(client):
    check_gradients(client, lambda x: dx.tan(x), {"x": (SHAPE, -1.2, 1.2)})


def test_reciprocal_on_both_signs(client):
    check_gradients(client, lambda x: dx.reciprocal(x), {"x": POSITIVE})
    check_gradients(client, lambda x: dx.reciprocal(-x), {"x": POSITIVE})


def test_inverse_hyperbolics_inside_their_domains(client):
    check_gradients(client, lambda x: dx.acosh(x), {"x": (SHAPE, 1.2, 3.0)})
    check_gradients(client, lambda x: dx.atanh(x), {"x": (SHAPE, -0.8, 0.8)})


@pytest.mark.parametrize("name", ["elu", "selu", "celu", "hard_sigmoid", "hard_swish", "mish",
                                  "thresholded_relu"])
def test_activations(client, name):
    check_gradients(client, lambda x: getattr(dx.nn, name)(x), {"x": (SHAPE, -4.0, 4.0)})


def test_prelu_gives_gradients_to_input_and_slope(client):
    check_gradients(client, lambda x, s: dx.nn.prelu(x, s),
                    {"x": ANY, "s": ((6,), 0.05, 0.5)})


def test_leaky_relu_and_clip(client):
    check_gradients(client, lambda x: dx.nn.leaky_relu(x, 0.2), {"x": ANY})
    check_gradients(client, lambda x: dx.clip(x, -0.5, 1.0), {"x": ANY})


@pytest.mark.parametrize("op", ["floor", "ceil", "round", "sign"])
def test_flat_operators_give_zero_gradients_also_for_infinite_cotangents(client, op):
    """Zero wherever the derivative exists, as in JAX; not 0 * g, which an infinite or NaN
    cotangent would turn into NaN."""
    x = dx.input("x", SHAPE, "float64")
    data = np.random.default_rng(3).uniform(-2.0, 2.0, SHAPE)
    loss = (getattr(dx, op)(x) * np.inf).sum() + (x * x).sum()
    g = dx.run(dx.grad(loss, x), inputs={"x": data}, client=client)
    np.testing.assert_array_equal(g, 2.0 * data)


@pytest.mark.parametrize("op", ["log", "sqrt"])
def test_unary_on_positive_values(client, op):
    check_gradients(client, lambda x: getattr(dx, op)(x), {"x": POSITIVE})


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum"])
@pytest.mark.parametrize("b_shape", [(6,), (5, 1), (1, 5, 6)])
def test_binary_with_broadcasting(client, op, b_shape):
    low = 0.5 if op == "div" else -2.0
    check_gradients(client, lambda a, b: getattr(dx, op)(a, b),
                    {"a": ANY, "b": (b_shape, low, 2.0)})


def test_exact_gelu(client):
    check_gradients(client, lambda x: dx.nn.gelu(x), {"x": ANY})


def test_pow(client):
    check_gradients(client, lambda a, b: a ** b, {"a": POSITIVE, "b": ((1, 6), -1.5, 2.5)})


def test_same_operand_twice_and_scalar_constants(client):
    check_gradients(client, lambda x: x * x * 3.0 - 2.0 / (x + 5.0) + x ** 2, {"x": ANY})


def test_where(client):
    check_gradients(client, lambda c, a, b: dx.where(c > 0, a, b),
                    {"c": ANY, "a": ANY, "b": ((6,), -1.0, 1.0)}, wrt=("a", "b"))


def test_cast_between_floats_passes_the_gradient(client):
    x = dx.input("x", (4, 3), "float64")
    r = np.arange(12, dtype=np.float32).reshape(4, 3)
    loss = (x.astype("float32") * dx.input("r", (4, 3), "float32")).sum()
    g = dx.grad(loss, x)
    assert g.dtype == "float64"
    np.testing.assert_array_equal(dx.run(g, inputs={"r": r}, client=client),
                                  r.astype(np.float64))


@pytest.mark.parametrize("a_shape,b_shape", [((5, 4), (4, 3)), ((2, 5, 4), (4, 3)),
                                             ((1, 5, 4), (3, 4, 2)), ((3, 1, 5, 4), (2, 4, 2))])
def test_matmul(client, a_shape, b_shape):
    check_gradients(client, lambda a, b: a @ b, {"a": (a_shape, -1, 1), "b": (b_shape, -1, 1)})


@pytest.mark.parametrize("op", ["sum", "mean", "prod", "max", "min"])
@pytest.mark.parametrize("axis,keepdims", [(0, False), (1, True), (None, False),
                                           ((0, 2), False), ((0, 2), True)])
def test_reductions(client, op, axis, keepdims):
    check_gradients(client, lambda x: getattr(dx, op)(x, axis=axis, keepdims=keepdims),
                    {"x": ((4, 3, 5), -2, 2)})


def test_prod_with_zeros_gives_the_product_of_the_others(client):
    """Not prod / x (NaN at a zero): a row with one zero has a gradient only there, the
    product of the others; a row with two zeros has none."""
    data = np.random.default_rng(5).uniform(0.5, 1.5, (4, 6))
    data[1, 2] = 0.0
    data[2, [0, 4]] = 0.0
    x = dx.input("x", data.shape, "float64")
    weights = np.arange(1.0, 5.0)
    got = dx.run(dx.grad((dx.prod(x, axis=1) * weights).sum(), x), inputs={"x": data},
                 client=client, cluster=cluster_with_memory(BUDGETS[-1]))
    want = np.array([[w * np.prod(np.delete(row, j)) for j in range(row.size)]
                     for w, row in zip(weights, data)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert got[1, 2] != 0 and np.all(got[1, [0, 1, 3, 4, 5]] == 0) and np.all(got[2] == 0)


def test_max_splits_ties_evenly(client):
    x = dx.input("x", (2, 3), "float64")
    g = dx.grad(dx.max(x, axis=1).sum(), x)
    got = dx.run(g, inputs={"x": np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])}, client=client)
    np.testing.assert_array_equal(got, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, 1])
def test_softmax(client, op, axis):
    check_gradients(client, lambda x: getattr(dx, op)(x, axis=axis), {"x": ((5, 7), -3, 3)})


def test_transpose_and_reshape(client):
    check_gradients(client, lambda x: x.transpose(2, 0, 1).reshape(6, 10),
                    {"x": ((3, 4, 5), -1, 1)})


def test_concat(client):
    check_gradients(client, lambda a, b, c: dx.concat([a, b, c], axis=1),
                    {"a": ((4, 2), -1, 1), "b": ((4, 5), -1, 1), "c": ((4, 1), -1, 1)})


@pytest.mark.parametrize("index", [(slice(1, 4), slice(None)), (slice(1, None, 2), slice(0, 5, 3)),
                                   (2, slice(None, None, 4)), (slice(3, 3), slice(None)),
                                   (slice(None, None, 5), 1)])
def test_slice(client, index):
    check_gradients(client, lambda x: x[index], {"x": ((6, 7), -1, 1)})


def test_softmax_cross_entropy_of_a_small_mlp(client):
    def model(x, w1, b1, w2, t):
        h = dx.tanh(x @ w1 + b1)
        return -(t * dx.log_softmax(h @ w2, axis=1)).sum(axis=1)
    check_gradients(client, model, {"x": ((8, 5), -1, 1), "w1": ((5, 4), -1, 1),
                                    "b1": ((4,), -1, 1), "w2": ((4, 3), -1, 1),
                                    "t": ((8, 3), 0, 1)}, wrt=("w1", "b1", "w2", "x"))


# -- random composite graphs ----------------------------------------------------------------
UNARY_SAFE = ["neg", "tanh", "sigmoid", "gelu", "exp_small", "square", "softmax0",
              "log_softmax1", "sum0", "mean1", "transpose"]
BINARY_SAFE = ["add", "sub", "mul", "maximum", "matmul_t"]


def _unary(op, x):
    if op == "exp_small":
        return dx.exp(x * 0.3)
    if op == "square":
        return x * x
    if op == "softmax0":
        return dx.softmax(x, axis=0)
    if op == "log_softmax1":
        return dx.log_softmax(x, axis=1)
    if op == "sum0":
        return x + x.sum(axis=0, keepdims=True)
    if op == "mean1":
        return x - x.mean(axis=1, keepdims=True)
    if op == "transpose":
        return x.T.T * 1.5
    return getattr(dx, op)(x)


def _binary(op, a, b):
    if op == "matmul_t":
        return (a @ b.T) @ a * 0.2
    return getattr(dx, op)(a, b)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), st.sampled_from(UNARY_SAFE),
                                st.sampled_from(BINARY_SAFE), st.integers(0, 10),
                                st.integers(0, 10)), min_size=1, max_size=6),
       seed=st.integers(0, 2**31))
def test_random_composite_graphs(client, steps, seed):
    def build(x, y):
        pool = [x, y]
        for is_unary, u, b, i, j in steps:
            a = pool[i % len(pool)]
            pool.append(_unary(u, a) if is_unary else _binary(b, a, pool[j % len(pool)]))
        return pool[-1] + pool[len(pool) // 2]
    # A drawn graph may keep both axes of a node whole (a softmax over one axis feeding one
    # over the other), which the small budgets cannot plan (a PlanError, as it should be):
    # such a case is checked under the budgets that fit and counted only if two do.
    ran = check_gradients(client, build, {"x": ((4, 4), -1, 1), "y": ((4, 4), -1, 1)},
                          seed=seed, budgets=(2**30, 1024, 300), min_grids=1)
    assume(ran >= 2)


# -- what has no gradient ---------------------------------------------------------------------
def test_a_path_only_through_a_comparison_names_the_comparison():
    x = dx.input("x", (3,), "float64")
    above = x > 0
    loss = dx.where(above, 1.0, 0.0).sum()
    with pytest.raises(dx.GraphError, match="no gradient reaches 'x'") as err:
        dx.grad(loss, x)
    assert err.value.node == above.node.id


def test_an_integer_cast_blocks_the_gradient():
    x = dx.input("x", (3,), "float64")
    rounded = x.astype("int32")
    with pytest.raises(dx.GraphError, match="has no gradient") as err:
        dx.grad(rounded.astype("float64").sum(), x)
    assert err.value.node == rounded.node.id


def test_a_condition_path_does_not_hide_the_values_path(client):
    x = dx.input("x", (4,), "float64")
    g = dx.grad(dx.where(x > 0, x * 2.0, x * -1.0).sum(), x)
    np.testing.assert_array_equal(dx.run(g, inputs={"x": np.array([-1.0, 2, -3, 4])},
                                         client=client), [-1, 2, -1, 2])


def test_unused_and_integer_inputs_and_non_scalar_results_are_refused():
    x = dx.input("x", (3,), "float64")
    unused = dx.input("unused", (3,), "float64")
    n = dx.input("n", (3,), "int64")
    with pytest.raises(dx.GraphError, match="does not depend on") as err:
        dx.grad(x.sum(), unused)
    assert err.value.node == "unused"
    with pytest.raises(dx.GraphError, match="floating-point") as err:
        dx.grad((x * n).sum(), n)
    assert err.value.node == "n"
    with pytest.raises(dx.GraphError, match="needs a scalar"):
        dx.grad(x * 2.0, x)
    with pytest.raises(dx.GraphError, match="only floating-point results"):
        dx.grad(n.sum(), x)


def test_a_cotangent_gives_the_vector_jacobian_product(client):
    x = dx.input("x", (3, 4), "float64")
    v = dx.input("v", (3, 4), "float64")
    g = dx.grad(dx.tanh(x), x, cotangent=v)
    xs, vs = np.linspace(-1, 1, 12).reshape(3, 4), np.linspace(2, 3, 12).reshape(3, 4)
    np.testing.assert_allclose(dx.run(g, inputs={"x": xs, "v": vs}, client=client),
                               vs * (1 - np.tanh(xs) ** 2), rtol=1e-14)
    with pytest.raises(dx.GraphError, match="cotangent is float64"):
        dx.grad(dx.tanh(x), x, cotangent=dx.input("w", (4,), "float64"))


def test_a_compiled_graph_is_refused():
    x = dx.input("x", (3,), "float64")
    fused = fuse_elementwise(dx.build_graph({"y": dx.exp(x * 2.0).sum()}))
    with pytest.raises(dx.GraphError, match="before compiling"):
        differentiate(fused, ["x"], of="y")


# -- gradients are ordinary graphs ------------------------------------------------------------
def test_gradients_round_trip_through_yaml_and_compile_like_forward_graphs(client):
    x = dx.input("x", (4000, 300), "float32")
    w = dx.input("w", (300, 50), "float32")
    loss = dx.log_softmax(dx.relu(x @ w), axis=1).mean()
    gw = dx.grad(loss, w)
    graph = dx.build_graph({"gw": gw})
    assert dx.from_yaml(dx.to_yaml(graph)) == graph
    # Chunked to a small budget, every elementwise step of the backward pass fused.
    spec = cluster_with_memory(8 * 2**20)
    plan = compile_graph(graph, spec)
    assert max(len(c) for c in plan.partition.chunks["x"]) > 1
    from deepx_flow.ops import ELEMENTWISE, get_op
    unfused = [n.op for n in plan.fused.nodes if get_op(n.op).kind == ELEMENTWISE
               and n.op != "fused"]
    assert unfused == []
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((4000, 300)).astype(np.float32)
    ws = (rng.standard_normal((300, 50)) * 0.1).astype(np.float32)
    got = dx.run(gw, inputs={"x": xs, "w": ws}, client=client, cluster=spec)
    h = np.maximum(xs.astype(np.float64) @ ws, 0)
    p = np.exp(h - h.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dh = (1.0 / h.size - p * (h.shape[1] / h.size)) * (h > 0)
    expected = xs.T.astype(np.float64) @ dh
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())
