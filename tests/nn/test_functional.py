"""Losses, one_hot, argmax/argmin, dropout and layers, against NumPy in float64."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from tests.compiler.test_differentiate import check_gradients
from tests.helpers import cluster_with_memory

GRIDS = (2**30, 2048, 600)


def numpy_log_softmax(z, axis=-1):
    shifted = z - z.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("memory", GRIDS)
def test_cross_entropy_from_class_labels_and_from_probabilities(client, memory):
    rng = np.random.default_rng(0)
    z = rng.standard_normal((50, 7)) * 3
    labels = rng.integers(0, 7, size=50)
    probs = rng.dirichlet(np.ones(7), size=50)
    zt, lt = dx.input("z", z.shape, "float64"), dx.input("l", labels.shape, "int64")
    pt = dx.input("p", probs.shape, "float64")
    outs = [dx.nn.cross_entropy(zt, lt), dx.nn.cross_entropy(zt, lt, reduction="sum"),
            dx.nn.cross_entropy(zt, lt, reduction="none"), dx.nn.cross_entropy(zt, pt)]
    got = dx.run(outs, inputs={"z": z, "l": labels, "p": probs}, client=client,
                 cluster=cluster_with_memory(memory))
    per = -numpy_log_softmax(z)[np.arange(50), labels]
    np.testing.assert_allclose(got[0], per.mean(), rtol=1e-12)
    np.testing.assert_allclose(got[1], per.sum(), rtol=1e-12)
    np.testing.assert_allclose(got[2], per, rtol=1e-12)
    np.testing.assert_allclose(got[3], -(probs * numpy_log_softmax(z)).sum(1).mean(),
                               rtol=1e-12)


def test_cross_entropy_along_the_class_axis_of_images(client):
    rng = np.random.default_rng(1)
    z = rng.standard_normal((4, 5, 3, 2))  # (N, C, H, W) as PyTorch lays them out
    labels = rng.integers(0, 5, size=(4, 3, 2))
    got = dx.run(dx.nn.cross_entropy(dx.input("z", z.shape, "float64"),
                                     dx.input("l", labels.shape, "int64"), axis=1,
                                     reduction="none"),
                 inputs={"z": z, "l": labels}, client=client)
    log_p = numpy_log_softmax(z, axis=1)
    want = -np.take_along_axis(log_p, labels[:, None], axis=1)[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_label_out_of_range_makes_the_loss_nan_not_zero(client):
    z = np.zeros((3, 4))
    loss = dx.nn.cross_entropy(dx.input("z", z.shape, "float64"),
                               dx.input("l", (3,), "int64"), reduction="none")
    got = dx.run(loss, inputs={"z": z, "l": np.array([1, 4, -1])}, client=client)
    assert np.isfinite(got[0]) and np.isnan(got[1:]).all()


def test_cross_entropy_gradient_with_class_labels(client):
    labels = np.array([0, 2, 1, 2, 0, 1])
    check_gradients(client, lambda z: dx.nn.cross_entropy(
        z, dx.full((6,), 0, "int64") + dx.input("l", (6,), "int64"), reduction="none"),
        {"z": ((6, 3), -2, 2)}, extra={"l": labels})


def test_mse_and_its_gradient(client):
    check_gradients(client, lambda a, b: dx.nn.mse(a, b, reduction="none") +
                    dx.nn.mse(a, b), {"a": ((5, 4), -1, 1), "b": ((5, 4), -1, 1)})
    with pytest.raises(dx.GraphError, match="differ in shape"):
        dx.nn.mse(dx.input("a", (3, 1)), dx.input("b", (3,)))


def test_one_hot(client):
    labels = np.array([[0, 3], [2, 5]])
    got = dx.run(dx.nn.one_hot(dx.input("l", (2, 2), "int64"), 4),
                 inputs={"l": labels}, client=client)
    want = (labels[..., None] == np.arange(4)).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    with pytest.raises(dx.GraphError, match="integer labels"):
        dx.nn.one_hot(dx.input("f", (2,)), 3)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), seed=st.integers(0, 2**32),
       nans=st.booleans(), ties=st.booleans(), memory=st.sampled_from(GRIDS),
       data=st.data())
def test_argmax_and_argmin_match_numpy(client, shape, seed, nans, ties, memory, data):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if ties:
        x = np.round(x)  # many equal values: the first one wins
    if nans:
        x[rng.random(shape) < 0.2] = np.nan
    axis = data.draw(st.sampled_from([None] + list(range(-len(shape), len(shape)))))
    if axis is None:  # flattening keeps the merged axes whole: one task holds all of x
        memory = max(memory, 80 * x.size)
    t = dx.input("x", x.shape, "float64")
    got = dx.run([t.argmax(axis), t.argmin(axis), dx.argmax(t.astype("int32") * 1, axis)],
                 inputs={"x": x}, client=client,
                 cluster=cluster_with_memory(memory))
    np.testing.assert_array_equal(got[0], np.argmax(x, axis))
    np.testing.assert_array_equal(got[1], np.argmin(x, axis))
    assert got[0].dtype == np.int64
    if not nans:
        np.testing.assert_array_equal(got[2], np.argmax(x.astype(np.int32), axis))


def test_dropout_depends_only_on_seed_step_and_index(client):
    x = dx.input("x", (300, 40), "float64")
    ones = np.ones((300, 40))
    a = dx.nn.dropout(x, 0.25, seed=3, step=7)
    runs = [dx.run(a, inputs={"x": ones}, client=client, cluster=cluster_with_memory(m))
            for m in (2**30, 20_000)]
    np.testing.assert_array_equal(runs[0], runs[1])
    kept = runs[0] != 0
    assert abs(kept.mean() - 0.75) < 0.03  # 12,000 draws: 5 standard deviations
    np.testing.assert_array_equal(runs[0][kept], 1 / 0.75)
    other = dx.run(dx.nn.dropout(x, 0.25, seed=3, step=8), inputs={"x": ones}, client=client)
    assert (other != runs[0]).mean() > 0.2
    assert dx.nn.dropout(x, 0.0, seed=1, step=1) is x
    assert dx.nn.dropout(x, 0.5, seed=1, step=None) is x  # inference
    with pytest.raises(dx.GraphError, match=r"rate must be in \[0, 1\)"):
        dx.nn.dropout(x, 1.0, seed=1, step=None)


def test_layers_are_functions_of_named_parameters(client):
    model = dx.nn.Sequential(dx.nn.Linear(6, 5), dx.nn.tanh, dx.nn.Linear(5, 2, bias=False))
    params = model.init(seed=4)
    assert {k: v.shape for k, v in params.items()} == {
        "0.weight": (6, 5), "0.bias": (5,), "2.weight": (5, 2)}
    assert model.init(seed=4)["0.weight"].node == params["0.weight"].node
    assert model.init(seed=5)["0.weight"].node != params["0.weight"].node
    values = dict(zip(params, dx.run(list(params.values()), client=client)))
    assert np.abs(values["0.weight"]).max() <= 1 / np.sqrt(6)
    assert np.abs(values["2.weight"]).max() <= 1 / np.sqrt(5)
    x = np.linspace(-1, 1, 18, dtype=np.float32).reshape(3, 6)
    got = dx.run(model(params, dx.input("x", (3, 6))), inputs={"x": x}, client=client)
    want = np.tanh(x @ values["0.weight"] + values["0.bias"]) @ values["2.weight"]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_layer_mistakes_are_named():
    model = dx.nn.Sequential(dx.nn.Linear(6, 5))
    params = model.init()
    with pytest.raises(dx.GraphError, match="last axis is 6"):
        model(params, dx.input("x", (3, 4)))
    with pytest.raises(dx.GraphError, match="missing parameter 'bias'"):
        model({"0.weight": params["0.weight"]}, dx.input("x", (3, 6)))
    with pytest.raises(dx.GraphError, match="belong to no layer"):
        model({**params, "1.weight": params["0.weight"]}, dx.input("x", (3, 6)))
    with pytest.raises(dx.GraphError, match="has shape"):
        model({**params, "0.bias": dx.zeros((4,))}, dx.input("x", (3, 6)))
    with pytest.raises(dx.GraphError, match="positive integer"):
        dx.nn.Linear(0, 3)


def test_a_masked_class_does_not_make_the_loss_nan(client):
    z = np.array([[0.5, -np.inf, 1.0], [2.0, 0.0, -np.inf]])
    labels = np.array([0, 1])
    got = dx.run(dx.nn.cross_entropy(dx.input("z", z.shape, "float64"),
                                     dx.input("l", (2,), "int64"), reduction="none"),
                 inputs={"z": z, "l": labels}, client=client)
    np.testing.assert_allclose(got, -numpy_log_softmax(z)[np.arange(2), labels], rtol=1e-12)
    probs = np.array([[0.3, 0.0, 0.7], [1.0, 0.0, 0.0]])
    soft = dx.run(dx.nn.cross_entropy(dx.input("z", z.shape, "float64"),
                                      dx.input("p", z.shape, "float64"), reduction="none"),
                  inputs={"z": z, "p": probs}, client=client)
    assert np.isfinite(soft).all()


def test_narrow_integer_labels_and_ids_index_large_tables(client):
    ids = np.array([250, 3, 255, 3], dtype=np.uint8)
    table = np.random.default_rng(0).standard_normal((300, 2))
    t = dx.input("t", table.shape, "float64")
    i = dx.input("i", ids.shape, "uint8")
    g = dx.grad(dx.take(t, i).sum(), t)
    got = dx.run(g, inputs={"i": ids}, client=client)
    want = np.zeros_like(table)
    np.add.at(want, ids.astype(np.int64), 1.0)
    np.testing.assert_array_equal(got, want)
    assert dx.nn.one_hot(dx.input("l", (3,), "int16"), 40_000).shape == (3, 40_000)


def test_the_gradient_of_a_float16_mean_of_many_elements(client):
    x = dx.input("x", (300, 300), "float16")
    got = dx.run(dx.grad(x.mean(), x), client=client)  # a constant: x is not read
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.float16(1 / 90_000))
