"""NumPy inputs travel inside the task graph, so they survive the loss of a worker.

A persisted result is computed, then the worker holding some of its chunks (and the input
chunks they came from) is killed for real. Gathering afterwards must still give the right
answer: Dask re-runs the lost tasks from the graph, input data included.
"""

import logging
import os
import signal

import numpy as np
import pytest
from distributed import Client, LocalCluster

import deepx_flow as dx
from tests.helpers import cluster_with_memory


def _pid():
    return os.getpid()


@pytest.mark.slow
def test_numpy_inputs_are_recomputed_after_a_worker_dies():
    data = np.random.default_rng(3).standard_normal((4000, 50))
    x = dx.input("x", data.shape, "float64")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        handle = dx.persist(dx.tanh(x) * 2.0, inputs={"x": data}, client=client,
                            cluster=cluster_with_memory(128 * 2**10)).wait()
        assert len(handle.futures) > 2
        holders = client.who_has(handle.futures)
        victim = next(iter(next(iter(holders.values()))))
        pids = client.run(_pid)
        os.kill(pids[victim], signal.SIGKILL)
        np.testing.assert_allclose(handle.to_numpy(), np.tanh(data) * 2.0, rtol=1e-12)
