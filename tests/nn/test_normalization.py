"""Normalization layers against NumPy in float64, on several chunk grids (the statistics
are reductions the compiler may split)."""

from __future__ import annotations

import numpy as np
import pytest

import deepx_flow as dx
from tests.helpers import cluster_with_memory

RNG = np.random.default_rng(0)
X = (RNG.standard_normal((6, 8, 5, 7)) * 3 + 1).astype(np.float32)
SCALE, BIAS = RNG.standard_normal(8).astype(np.float32), RNG.standard_normal(8).astype(np.float32)
MEMORIES = (2**30, 32 * 2**10, 8 * 2**10)


def normalized(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)


def per_channel(v):
    return v.astype(np.float64).reshape(1, -1, 1, 1)


def run_grids(client, out, feed):
    return [dx.run(out, inputs=feed, client=client, cluster=cluster_with_memory(m))
            for m in MEMORIES]


@pytest.mark.parametrize("name", ["batch", "layer", "instance", "group"])
def test_normalizations_match_numpy(client, name):
    x64 = X.astype(np.float64)
    x = dx.input("x", X.shape, "float32")
    s, b = dx.input("s", (8,), "float32"), dx.input("b", (8,), "float32")
    feed = {"x": X, "s": SCALE, "b": BIAS}
    if name == "batch":
        mean = RNG.standard_normal(8).astype(np.float32)
        var = RNG.uniform(0.5, 2, 8).astype(np.float32)
        feed.update(m=mean, v=var)
        out = dx.nn.batch_norm(x, s, b, dx.input("m", (8,), "float32"),
                               dx.input("v", (8,), "float32"), eps=1e-3)
        want = (x64 - per_channel(mean)) / np.sqrt(per_channel(var) + 1e-3) \
            * per_channel(SCALE) + per_channel(BIAS)
    elif name == "layer":
        out = dx.nn.layer_norm(x, dx.input("ls", (5, 7), "float32"), None, axis=2, eps=1e-5)
        ls = RNG.standard_normal((5, 7)).astype(np.float32)
        feed = {"x": X, "ls": ls}
        want = normalized(x64, (2, 3), 1e-5) * ls
    elif name == "instance":
        out = dx.nn.instance_norm(x, s, b, eps=1e-4)
        want = normalized(x64, (2, 3), 1e-4) * per_channel(SCALE) + per_channel(BIAS)
    else:
        out = dx.nn.group_norm(x, 4, s, b, eps=1e-5)
        grouped = x64.reshape(6, 4, 2, 5, 7)
        want = normalized(grouped, (2, 3, 4), 1e-5).reshape(X.shape) * per_channel(SCALE) \
            + per_channel(BIAS)
    for got in run_grids(client, out, feed):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def test_batch_statistics_are_the_biased_ones(client):
    x = dx.input("x", X.shape, "float32")
    mean, var = dx.nn.batch_norm_stats(x)
    got_mean, got_var = dx.run([mean, var], inputs={"x": X}, client=client)
    x64 = X.astype(np.float64)
    np.testing.assert_allclose(got_mean, x64.mean(axis=(0, 2, 3)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_var, x64.var(axis=(0, 2, 3)), rtol=1e-5)


def test_bad_shapes_are_named():
    x = dx.input("x", X.shape, "float32")
    with pytest.raises(dx.GraphError, match="one value per channel, shape \\(8,\\)"):
        dx.nn.instance_norm(x, dx.input("s", (7,), "float32"), dx.input("b", (8,), "float32"))
    with pytest.raises(dx.GraphError, match="3 groups must divide the 8 channels"):
        dx.nn.group_norm(x, 3, dx.input("s", (8,), "float32"), dx.input("b", (8,), "float32"))


def test_float16_is_normalized_in_float32(client):
    """Squared deviations above 256 overflow float16: the statistics are float32."""
    data = np.array([[300, -300, 0, 0], [1000, -1000, 500, -500]], dtype=np.float16)
    x = dx.input("x", data.shape, "float16")
    got = dx.run(dx.nn.layer_norm(x), inputs={"x": data}, client=client)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, normalized(data.astype(np.float64), (1,), 1e-5),
                               rtol=2e-3, atol=2e-3)
