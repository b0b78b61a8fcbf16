"""Gradients of `conv`, `max_pool` and `avg_pool` (`ops/window_grad.py`).

Checked in float64 against central finite differences of the NumPy reference interpreter
(`tests.reference`, itself checked against the loop references of `tests/kernels`) for
fixed cases of every attribute, 1-D to 3-D, under chunk grids from one chunk to one image
per task; against loop references of the vector-Jacobian products (max_pool's tie and NaN
rule included) for random attributes (hypothesis); and a small CNN whose gradients equal
finite differences and which trains.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.differentiate import differentiate
from deepx_flow.sdk.tensor import apply
from tests.compiler.test_differentiate import finite_differences
from tests.helpers import cluster_with_memory
from tests.kernels.test_window import CONV_CASES, positions, ref_conv, ref_pool
from tests.reference import evaluate

# Per-task budgets from one chunk down to where one image per task no longer fits: each
# case runs once per different chunk grid these give.
BUDGETS = (2**30,) + tuple(int(2**k) for k in np.arange(17, 11.5, -0.5))


def check(client, build, values: dict, wrt, seed: int = 0, budgets=BUDGETS):
    """`sum(build(**inputs) * r)` for a random cotangent r: the engine's gradients with
    respect to `wrt` equal central differences of the NumPy evaluation, under each chunk
    grid (chunks along the first axis of every node) that `budgets` give: one chunk, and
    down to one image per task. Returns the gradients of the last run."""
    inputs = {n: dx.input(n, v.shape, "float64") for n, v in values.items()}
    y = build(**inputs)
    values = dict(values, r=np.random.default_rng(seed).uniform(-1, 1, y.shape))
    loss = (y * dx.input("r", y.shape, "float64")).sum()
    grads = dx.grad(loss, [inputs[n] for n in wrt])
    expected = [finite_differences(loss, values, n) for n in wrt]
    graph = dx.build_graph(grads)
    feed = needed(grads, values)
    grids = set()
    for memory in budgets:
        spec = cluster_with_memory(memory)
        try:
            plan = compile_graph(graph, spec)
        except dx.PlanError:
            break
        grid = tuple(len(plan.chunks[n.id][0]) for n in plan.fused.nodes if n.ndim)
        if grid in grids:
            continue
        grids.add(grid)
        got = dx.run(grads, inputs=feed, client=client, cluster=spec)
        for name, g, e in zip(wrt, got, expected):
            assert g.shape == values[name].shape and g.dtype == np.float64
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6 * (1 + np.abs(e).max()),
                                       err_msg=f"d/d{name} with budget {memory}")
    # one chunk, and as many as images (pools fold channels into the batch axis: more)
    assert (1,) * len(grid) in grids and max(max(g) for g in grids) >= len(values["x"]), grids
    return got


def needed(outputs, values: dict) -> dict:
    """The values of the inputs `outputs` read (avg_pool's gradient does not read x)."""
    return {n.id: values[n.id] for n in dx.build_graph(outputs).inputs}


def distinct(shape, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Values at least (high - low) / size apart, in random order: no two within a finite
    difference step, so every window's maximum is one element."""
    size = int(np.prod(shape))
    order = np.random.default_rng(seed).permutation(size)
    return (low + (high - low) * order / size).reshape(shape)


def pool(op, x, kernel, strides, pads, dilations, include=0):
    """The pooling node with every attribute given (`dx.nn.avg_pool` has no dilation)."""
    extra = {"count_include_pad": include} if op == "avg_pool" else {}
    return apply(op, [x], kernel=kernel, strides=strides, pads=pads, dilations=dilations,
                 **extra)


# -- the NumPy reference the finite differences are taken of ---------------------------------
def test_the_reference_interpreter_computes_windows_as_the_loop_references():
    rng = np.random.default_rng(4)
    for xs, ws, strides, pads, dil, groups in CONV_CASES:
        x, w = dx.input("x", xs, "float64"), dx.input("w", ws, "float64")
        y = apply("conv", [x, w], strides=strides, pads=pads, dilations=dil, groups=groups)
        X, W = rng.standard_normal(xs), rng.standard_normal(ws)
        got = evaluate(dx.build_graph({"y": y}), {"x": X, "w": W})["y"]
        np.testing.assert_allclose(got, ref_conv(X, W, strides, pads, dil, groups),
                                   rtol=1e-12, atol=1e-12)
    X = rng.standard_normal((2, 3, 7, 6))
    X[0, 1, 2, 3] = np.nan
    for op, include in (("max_pool", 0), ("avg_pool", 0), ("avg_pool", 1)):
        args = ((3, 2), (2, 1), (1, 0, 1, 1), (1, 2))
        y = pool(op, dx.input("x", X.shape, "float64"), *args, include)
        got = evaluate(dx.build_graph({"y": y}), {"x": X})["y"]
        np.testing.assert_allclose(got, ref_pool(op, X, *args, include), equal_nan=True,
                                   rtol=1e-12, atol=1e-12)


# -- conv ----------------------------------------------------------------------------------
EXTRA_CONV_CASES = [
    # pads past the kernel's reach and a stride past the kernel: taps on padding only,
    # input positions no window reads (their gradient is zero)
    ((2, 2, 8), (3, 2, 2), (3,), (3, 2), (1,), 1),
    # depthwise with two filters per channel, strided and dilated
    ((2, 3, 6, 5), (6, 1, 2, 3), (2, 1), (0, 1, 1, 0), (2, 1), 3),
    # a 1x1 convolution (a matmul over channels at every position), strided
    ((3, 4, 5, 5), (2, 4, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("case", CONV_CASES + EXTRA_CONV_CASES,
                         ids=lambda c: f"x{c[0]}-w{c[1]}-s{c[2]}-g{c[5]}")
def test_conv_gradients_equal_finite_differences(client, case):
    xs, ws, strides, pads, dil, groups = case
    rng = np.random.default_rng(1)
    check(client, lambda x, w: apply("conv", [x, w], strides=strides, pads=pads,
                                     dilations=dil, groups=groups),
          {"x": rng.uniform(-1, 1, xs), "w": rng.uniform(-1, 1, ws)}, ("x", "w"))


def test_conv_with_bias_through_the_sdk(client):
    rng = np.random.default_rng(2)
    check(client, lambda x, w, b: dx.nn.conv(x, w, b, stride=2, padding=1),
          {"x": rng.uniform(-1, 1, (3, 2, 6, 7)), "w": rng.uniform(-1, 1, (4, 2, 3, 3)),
           "b": rng.uniform(-1, 1, (4,))}, ("x", "w", "b"))


def test_conv_transpose_is_the_adjoint_of_conv(client):
    """<conv(x, w), y> = <x, conv_transpose(y, w)>: the SDK's transposed convolution and
    conv's input gradient are one composition."""
    rng = np.random.default_rng(3)
    X, W = rng.standard_normal((2, 4, 9, 8)), rng.standard_normal((6, 2, 3, 3))
    x, w = dx.input("x", X.shape, "float64"), dx.input("w", W.shape, "float64")
    y = dx.nn.conv(x, w, stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2), groups=2)
    Y = rng.standard_normal(y.shape)
    back = dx.nn.conv_transpose(dx.input("y", Y.shape, "float64"), w, stride=(2, 1),
                                padding=(1, 0, 2, 1), dilation=(1, 2), groups=2,
                                output_padding=(1, 0))
    assert back.shape == X.shape
    got_y, got_back = dx.run([y, back], inputs={"x": X, "w": W, "y": Y}, client=client)
    np.testing.assert_allclose(np.vdot(got_y, Y), np.vdot(X, got_back), rtol=1e-12)
    np.testing.assert_allclose(got_back, ref_conv_vjp(X, W, Y, (2, 1), (1, 0, 2, 1), (1, 2),
                                                      2)[0], rtol=1e-12, atol=1e-12)


# -- pools ---------------------------------------------------------------------------------
POOL_CASES = [
    # x shape, kernel, strides, pads, dilations
    ((2, 3, 6, 6), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),           # the usual, no overlap
    ((2, 2, 7, 6), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),           # overlapping, padded
    ((2, 2, 9), (3,), (1,), (2, 1), (2,)),                          # 1-D, dilated
    ((2, 2, 4, 5, 3), (2, 2, 2), (1, 2, 1), (1, 0, 0, 0, 1, 1), (1, 1, 1)),  # 3-D
    ((2, 2, 8, 7), (2, 2), (3, 3), (1, 0, 0, 1), (1, 1)),           # gaps between windows
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"x{c[0]}-k{c[1]}-s{c[2]}")
def test_max_pool_gradient_equals_finite_differences(client, case):
    xs, kernel, strides, pads, dil = case
    check(client, lambda x: pool("max_pool", x, kernel, strides, pads, dil),
          {"x": distinct(xs)}, ("x",))


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"x{c[0]}-k{c[1]}-s{c[2]}")
def test_avg_pool_gradient_equals_finite_differences(client, case, include):
    xs, kernel, strides, pads, dil = case
    check(client, lambda x: pool("avg_pool", x, kernel, strides, pads, dil, include),
          {"x": np.random.default_rng(5).uniform(-1, 1, xs)}, ("x",))


def test_max_pool_of_negative_values_never_routes_to_padding(client):
    """Padding is the lowest value in the forward pass, so it never wins; the gradient of a
    window of negative values goes to its maximum, on the data."""
    check(client, lambda x: dx.nn.max_pool(x, 3, stride=2, padding=1),
          {"x": distinct((2, 2, 5, 5), seed=6, low=-9.0, high=-1.0)}, ("x",))


def max_pool_grad(client, X, G, kernel, stride, padding=0):
    x = dx.input("x", X.shape, X.dtype.name)
    y = dx.nn.max_pool(x, kernel, stride=stride, padding=padding)
    g = dx.grad(y, x, cotangent=dx.input("g", y.shape, X.dtype.name))
    return dx.run(g, inputs=needed(g, {"x": X, "g": G}), client=client)


def test_max_pool_routes_a_tie_to_the_first_maximum_in_window_order(client):
    X = np.array([[[[1.0, 5.0, 5.0, 0.0],
                    [5.0, 2.0, 3.0, 3.0]]]])
    G = np.array([[[[10.0, 20.0]]]])
    got = max_pool_grad(client, X, G, 2, 2)
    # window 1: 5 at (0,1) and (1,0), first in row-major order is (0,1); window 2: 5 at
    # (0,2) alone, though 3 ties at (1,2) and (1,3) for second place
    np.testing.assert_array_equal(got, [[[[0, 10, 20, 0], [0, 0, 0, 0]]]])
    # overlapping windows (3 x 3, stride 1): each window's whole cotangent goes to one
    # position, so the gradient sums to the cotangent's sum
    X = np.zeros((1, 1, 4, 4))
    G = np.arange(1.0, 5.0).reshape(1, 1, 2, 2)
    got = max_pool_grad(client, X, G, 3, 1)
    want = np.zeros((1, 1, 4, 4))
    want[0, 0, 0, 0], want[0, 0, 0, 1], want[0, 0, 1, 0], want[0, 0, 1, 1] = G.ravel()
    np.testing.assert_array_equal(got, want)


def test_max_pool_routes_a_nan_window_to_its_first_nan(client):
    nan = np.nan
    X = np.array([[[[1.0, nan, 7.0, 2.0],
                    [nan, 9.0, 3.0, 4.0]]]])
    G = np.array([[[[10.0, 20.0]]]])
    got = max_pool_grad(client, X, G, 2, 2)
    np.testing.assert_array_equal(got, [[[[0, 10, 20, 0], [0, 0, 0, 0]]]])


def test_max_pool_of_minus_infinity_routes_to_the_data_not_the_padding(client):
    X = np.full((1, 1, 3, 3), -np.inf)
    G = np.arange(1.0, 5.0).reshape(1, 1, 2, 2)
    got = max_pool_grad(client, X, G, 2, 2, padding=1)
    # each 2 x 2 window has one data position (the corners of the padded 4 x 4): the
    # padding before it in window order ties with -inf but gets nothing
    want = np.zeros((1, 1, 3, 3))
    want[0, 0, 0, 0], want[0, 0, 0, 1], want[0, 0, 1, 0], want[0, 0, 1, 1] = G.ravel()
    np.testing.assert_array_equal(got, want)


def test_float32_pools_keep_their_dtype(client):
    X = distinct((2, 3, 6, 6)).astype(np.float32)
    x = dx.input("x", X.shape, "float32")
    for y in (dx.nn.max_pool(x, 3, stride=2, padding=1),
              dx.nn.avg_pool(x, 3, stride=2, padding=1)):
        G = np.random.default_rng(7).standard_normal(y.shape).astype(np.float32)
        g = dx.grad(y, x, cotangent=dx.input("g", y.shape, "float32"))
        assert g.dtype == "float32"
        got = dx.run(g, inputs=needed(g, {"x": X, "g": G}), client=client)
        op = y.node.op
        want = ref_pool_vjp(op, X.astype(np.float64), G.astype(np.float64), (3, 3), (2, 2),
                            (1, 1, 1, 1), (1, 1))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_integer_max_pool_passes_no_gradient():
    x = dx.input("x", (1, 1, 4, 4), "float64")
    rounded = x.astype("int32")
    pooled = dx.nn.max_pool(rounded, 2)
    with pytest.raises(dx.GraphError, match="has no gradient") as err:
        dx.grad(pooled.astype("float64").sum(), x)
    assert err.value.node == rounded.node.id


# -- loop references of the vector-Jacobian products ------------------------------------------
def ref_conv_vjp(x, w, r, strides, pads, dil, groups):
    """(dx, dw) of sum(conv(x, w) * r), each product added where the forward loop reads."""
    dx_, dw = np.zeros_like(x), np.zeros_like(w)
    cg, mg = x.shape[1] // groups, w.shape[0] // groups
    for o, taps in positions(x.shape, w.shape[2:], strides, pads, dil):
        for at, k in taps:
            if at is None:
                continue
            for g in range(groups):
                ci, mi = slice(g * cg, (g + 1) * cg), slice(g * mg, (g + 1) * mg)
                rg = r[(slice(None), mi) + o]                              # (n, mg)
                dx_[(slice(None), ci) + at] += rg @ w[(mi, slice(None)) + k]
                dw[(mi, slice(None)) + k] += rg.T @ x[(slice(None), ci) + at]
    return dx_, dw


def ref_pool_vjp(op, x, r, kernel, strides, pads, dil, include=0):
    """dx of sum(pool(x) * r): avg_pool's cotangent over the window's count to each of its
    data positions; max_pool's to the first data position in window order that holds the
    window's maximum, or the first NaN."""
    out = np.zeros_like(x)
    every = (slice(None), slice(None))
    for o, taps in positions(x.shape, kernel, strides, pads, dil):
        inside = [at for at, _ in taps if at is not None]
        share = r[every + o]
        if op == "avg_pool":
            count = len(taps) if include else len(inside)
            for at in inside:
                out[every + at] += share / count
            continue
        values = np.stack([x[every + at] for at in inside])
        top = np.where(np.isnan(values).any(0), np.nan, values.max(0))
        hit = (values == top) | np.isnan(values)
        first = hit.argmax(0)
        for t, at in enumerate(inside):
            out[every + at] += np.where(first == t, share, 0.0)
    return out


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_windows_match_the_loop_references(client, data):
    """Gradients for random attributes, 1-D to 3-D, against the loop references; max_pool's
    inputs are drawn from a few values (ties) with a NaN now and then."""
    spatial = data.draw(st.integers(1, 3))
    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(spatial))
    dil = tuple(data.draw(st.integers(1, 2)) for _ in range(spatial))
    strides = tuple(data.draw(st.integers(1, 3)) for _ in range(spatial))
    pads = tuple(data.draw(st.integers(0, dil[a % spatial] * (kernel[a % spatial] - 1) + 1))
                 for a in range(2 * spatial))
    most = 7 if spatial < 3 else 5
    sizes = tuple(data.draw(st.integers(max(1, dil[a] * (kernel[a] - 1) + 1 - pads[a]
                                                - pads[spatial + a]), most))
                  for a in range(spatial))
    op = data.draw(st.sampled_from(["conv", "max_pool", "avg_pool"]))
    groups = data.draw(st.sampled_from([1, 2])) if op == "conv" else 1
    channels = groups * data.draw(st.integers(1, 2))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    xs = (2, channels) + sizes
    X = rng.standard_normal(xs)
    x = dx.input("x", xs, "float64")
    try:
        if op == "conv":
            W = rng.standard_normal((groups * data.draw(st.integers(1, 2)),
                                     channels // groups) + kernel)
            w = dx.input("w", W.shape, "float64")
            y = apply("conv", [x, w], strides=strides, pads=pads, dilations=dil,
                      groups=groups)
        else:
            include = data.draw(st.sampled_from([0, 1]))
            if op == "max_pool":
                X = rng.integers(-1, 2, size=xs).astype(np.float64)  # ties everywhere
                if data.draw(st.booleans()):
                    X.reshape(-1)[data.draw(st.integers(0, X.size - 1))] = np.nan
            y = pool(op, x, kernel, strides, pads, dil, include)
    except dx.GraphError:  # a window of padding only, or no room for one
        assume(False)
    R = rng.standard_normal(y.shape)
    wrt = [x, w] if op == "conv" else [x]
    grads = dx.grad(y, wrt, cotangent=dx.input("r", y.shape, "float64"))
    feed = needed(grads, {"x": X, "r": R, **({"w": W} if op == "conv" else {})})
    # one image per task where the plan allows it (a tiny budget), else one chunk
    for memory in (24 * 2**10, 2**30):
        try:
            compile_graph(dx.build_graph(grads), cluster_with_memory(memory))
            break
        except dx.PlanError:
            continue
    got = dx.run(grads, inputs=feed, client=client, cluster=cluster_with_memory(memory))
    if op == "conv":
        want = ref_conv_vjp(X, W, R, strides, pads, dil, groups)
    else:
        want = (ref_pool_vjp(op, X, R, kernel, strides, pads, dil, include),)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-10)


# -- a small CNN ---------------------------------------------------------------------------
def cnn(p, x):
    """conv -> relu -> max_pool -> flatten -> matmul: (N, 1, 8, 8) images, 3 classes."""
    h = dx.relu(dx.nn.conv(x, p["w1"], p["b1"], padding=1))
    h = dx.nn.max_pool(h, 2)
    return h.reshape(x.shape[0], -1) @ p["w2"] + p["b2"]


def quadrant_images(n: int, seed: int):
    """Noise with a bright 3 x 3 patch in the top left (class 0), top right (1) or bottom
    (2) of an 8 x 8 image."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, size=n)
    images = rng.normal(0, 0.3, (n, 1, 8, 8))
    for i, c in enumerate(labels):
        row, col = (0, 0) if c == 0 else (0, 5) if c == 1 else (5, rng.integers(0, 6))
        images[i, 0, row:row + 3, col:col + 3] += 2.0
    return images, labels


def cnn_start(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(0, 0.4, (4, 1, 3, 3)), "b1": rng.normal(0, 0.1, (4,)),
            "w2": rng.normal(0, 0.2, (64, 3)), "b2": np.zeros(3)}


def test_a_small_cnn_has_the_gradients_of_finite_differences(client):
    images, labels = quadrant_images(6, seed=8)
    values = dict(cnn_start(9), x=images, t=np.eye(3)[labels])

    def loss(x, t, **p):  # the mean cross-entropy
        return -(t * dx.log_softmax(cnn(p, x), axis=1)).sum(axis=1).mean()

    check(client, loss, values, ("w1", "b1", "w2", "b2", "x"))


def test_a_small_cnn_trains(client):
    images, labels = quadrant_images(96, seed=10)
    start = {k: v.astype(np.float32) for k, v in cnn_start(11).items()}
    fit = dx.train(lambda p, x, y: dx.nn.cross_entropy(cnn(p, x), y), start,
                   data=(images.astype(np.float32), labels), batch_size=32, epochs=5,
                   optimizer=dx.optim.Adam(lr=0.03), seed=0, progress=False, client=client)
    losses = [h["loss"] for h in fit.history]
    assert len(losses) == 15
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])
    logits = dx.run(cnn(fit.params, dx.input("x", images.shape, "float32")),
                    inputs={**fit.inputs, "x": images.astype(np.float32)}, client=client)
    assert (logits.argmax(axis=1) == labels).mean() > 0.9


def test_a_tiny_budget_gives_many_chunks_and_the_same_gradients(client):
    """One image per task for the windows, the weight gradients' contraction over images
    and positions split into partial products that are tree-summed: the same numbers as one
    chunk."""
    images, labels = quadrant_images(16, seed=12)
    values = dict(cnn_start(13), x=images, t=np.eye(3)[labels])
    p = {k: dx.input(k, v.shape, "float64") for k, v in cnn_start(13).items()}
    x, t = dx.input("x", images.shape, "float64"), dx.input("t", (16, 3), "float64")
    loss = -(t * dx.log_softmax(cnn(p, x), axis=1)).sum(axis=1).mean()
    grads = dx.grad(loss, list(p.values()))
    graph = dx.build_graph(grads)
    tiny = cluster_with_memory(32 * 2**10)
    plan = compile_graph(graph, tiny)
    windows = [n for n in plan.fused.nodes if n.op in ("conv", "max_pool")]
    assert windows and all(len(plan.chunks[n.id][0]) == 16 for n in windows)
    split = [n.id for n in plan.fused.nodes
             if n.op == "matmul" and len(plan.partition.k_chunks.get(n.id, ())) > 1]
    assert split, "no weight gradient's contraction was split"
    feed = needed(grads, values)
    whole = dx.run(grads, inputs=feed, client=client, cluster=cluster_with_memory(2**30))
    chunked = dx.run(grads, inputs=feed, client=client, cluster=tiny)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    # and finite differences agree with both
    loss_fd = {n: finite_differences(loss, values, n) for n in ("w1", "w2")}
    for name, got in zip(p, chunked):
        if name in loss_fd:
            np.testing.assert_allclose(got, loss_fd[name], rtol=1e-6, atol=1e-7)


def test_window_gradients_round_trip_through_yaml():
    x = dx.input("x", (2, 3, 6, 6), "float32")
    w = dx.input("w", (4, 3, 3, 3), "float32")
    y = dx.nn.avg_pool(dx.nn.max_pool(dx.nn.conv(x, w, stride=2, padding=1), 2, stride=1),
                       2, padding=1)
    graph = dx.build_graph({"g": dx.grad(y.sum(), w)})
    assert dx.from_yaml(dx.to_yaml(graph)) == graph


def test_a_spec_with_default_attributes_differentiates(client):
    """A conv without strides, pads, dilations or groups and a max_pool with only its kernel
    (the defaults of a YAML spec: strides of 1, not the kernel) differentiate like fully
    stated ones."""
    graph = dx.from_yaml("deepx: 1\n"
                         "inputs:\n"
                         "  x: {shape: [2, 3, 6, 5], dtype: float64}\n"
                         "  w: {shape: [4, 3, 2, 2], dtype: float64}\n"
                         "  r: {shape: [2, 4, 4, 3], dtype: float64}\n"
                         "nodes:\n"
                         "  - {id: y, op: conv, args: [x, w]}\n"
                         "  - {id: p, op: max_pool, args: [y], attrs: {kernel: [2, 2]}}\n"
                         "  - {id: weighted, op: mul, args: [p, r]}\n"
                         "  - {id: loss, op: sum, args: [weighted], attrs: {axes: [0, 1, 2, 3]}}\n"
                         "outputs: [loss]\n")
    grads = differentiate(graph, ["x", "w"], of="loss")
    rng = np.random.default_rng(14)
    values = {"x": rng.standard_normal((2, 3, 6, 5)), "w": rng.standard_normal((4, 3, 2, 2)),
              "r": rng.standard_normal((2, 4, 4, 3))}
    got = dx.run(grads, inputs=values, client=client)
    y = ref_conv(values["x"], values["w"], (1, 1), (0, 0, 0, 0), (1, 1), 1)
    dy = ref_pool_vjp("max_pool", y, values["r"], (2, 2), (1, 1), (0, 0, 0, 0), (1, 1))
    want = ref_conv_vjp(values["x"], values["w"], dy, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    np.testing.assert_allclose(got["grad_x"], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["grad_w"], want[1], rtol=1e-12, atol=1e-12)
