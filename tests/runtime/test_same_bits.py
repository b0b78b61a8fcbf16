"""A graph run again on the same cluster gives the same bits (issue 31, item 7).

Each run teaches the registry its operators' speeds, and a plan made for new speeds may cut
other chunks, which rounds float sums in another order: the first and second runs of an
imported conv net differed by 7e-6. The plan chosen for a graph and a cluster is now kept
(`runtime/plan_cache.py`) until the cluster changes or a run asks to plan again. Here: a
fresh metadata database (so the first run plans without speeds and records them), several
graphs, each run three times, compared bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.meta.db import close_all
from deepx_flow.runtime import plan_cache


def _graphs(rng):
    x = dx.input("x", (3000, 64), "float32")
    w1 = rng.standard_normal((64, 48)).astype(np.float32)
    w2 = rng.standard_normal((48, 10)).astype(np.float32)
    centered = x - x.mean(axis=0)
    images = dx.input("images", (64, 3, 20, 20), "float32")
    kernel = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    conv = dx.nn.max_pool(dx.relu(dx.nn.conv(images, kernel, padding=1)), 2)
    return {
        "mlp": dx.softmax(dx.relu(x @ w1) @ w2, axis=1),
        "standardize": centered / dx.sqrt((centered * centered).mean(axis=0)),
        "conv": dx.nn.global_avg_pool(conv).sum(axis=(1, 2, 3)),
        "sums": (x * 1e-3).sum(axis=0) + dx.exp(x * 1e-2).sum(),
    }


@pytest.mark.parametrize("name", ["mlp", "standardize", "conv", "sums"])
def test_a_graph_run_again_on_the_same_cluster_gives_the_same_bits(client, tmp_path,
                                                                      monkeypatch, name):
    monkeypatch.setenv("DEEPX_DB_URL", f"sqlite:///{(tmp_path / 'fresh.db').as_posix()}")
    rng = np.random.default_rng(4)
    feed = {"x": rng.standard_normal((3000, 64)).astype(np.float32),
            "images": rng.standard_normal((64, 3, 20, 20)).astype(np.float32)}
    out = _graphs(np.random.default_rng(5))[name]
    read = {n.id for n in dx.build_graph(out).inputs}
    inputs = {k: v for k, v in feed.items() if k in read}
    try:
        plan_cache.clear()
        first = dx.run(out, inputs=inputs, client=client)
        again = [dx.run(out, inputs=inputs, client=client) for _ in range(2)]
        assert plan_cache.cache_info().misses == 1  # planned once, with no speeds known
        for result in again:
            assert result.dtype == first.dtype
            assert result.tobytes() == first.tobytes()
        replanned = dx.run(out, inputs=inputs, client=client, replan=True)
        assert plan_cache.cache_info().misses == 2
        np.testing.assert_allclose(replanned, first, rtol=1e-5,
                                   atol=1e-5 * np.abs(first).max())
    finally:
        close_all()
