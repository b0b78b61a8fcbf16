"""A graph whose input is three times a worker's memory limit runs within that limit.

Two worker processes with a small memory limit read a `.npy` input three times larger than
one worker's limit, chunk by chunk, and reduce it. The workers' resident memory is sampled
throughout; it must stay under the limit (Dask's nanny would kill a worker that crossed it).
"""

import logging

import numpy as np
import pytest
from distributed import Client, LocalCluster

import deepx_flow as dx
from tests.helpers import WorkerRss

LIMIT = 400 * 2**20


@pytest.mark.slow
def test_input_three_times_worker_memory(tmp_path):
    rows, cols = (3 * LIMIT) // (256 * 4), 256
    path = tmp_path / "x.npy"
    data = np.lib.format.open_memmap(path, mode="w+", dtype="float32", shape=(rows, cols))
    rng = np.random.default_rng(1)
    for start in range(0, rows, 200_000):
        stop = min(rows, start + 200_000)
        data[start:stop] = rng.standard_normal((stop - start, cols), dtype="float32")
    data.flush()
    del data
    assert path.stat().st_size >= 3 * LIMIT

    x = dx.input("x", (rows, cols), "float32")
    col_mean = dx.tanh(x * 0.5 + 0.1).mean(axis=0)
    col_max = x.max(axis=0)
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=LIMIT, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        with WorkerRss(client) as rss:
            got_mean, got_max = dx.run([col_mean, col_max], inputs={"x": str(path)},
                                       client=client)
        plan = dx.compile([col_mean, col_max], client=client)
        assert len(plan.chunks["x"][0]) > 3  # it really was split

    ref = np.load(path, mmap_mode="r")
    exp_mean = np.zeros(cols)
    exp_max = np.full(cols, -np.inf)
    for start in range(0, rows, 200_000):
        block = np.asarray(ref[start:start + 200_000], dtype="float64")
        exp_mean += np.tanh(block * 0.5 + 0.1).sum(axis=0)
        exp_max = np.maximum(exp_max, block.max(axis=0))
    np.testing.assert_allclose(got_mean, exp_mean / rows, rtol=1e-4)
    np.testing.assert_array_equal(got_max, exp_max.astype("float32"))
    assert 0 < rss.peak < LIMIT, (
        f"peak worker RSS {rss.peak / 2**20:.0f} MiB over the {LIMIT / 2**20:.0f} MiB limit; "
        f"the plan: {len(plan.chunks['x'][0])} row chunks, per-task budget "
        f"{plan.partition.budget / 2**20:.0f} MiB")
