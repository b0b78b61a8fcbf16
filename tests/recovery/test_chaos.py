"""Chaos: a run of a few hundred tasks on four worker processes survives a worker killed
with SIGKILL at a random moment, ten times in a row, with results identical to an
undisturbed run; and no placement row leaves a chunk on a dead worker.

Dask recomputes what the dead worker held from the graph (the nanny starts a replacement);
the recorder marks that worker's chunks lost when the scheduler removes it.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.meta.models import ChunkPlacement, Event, Run
from tests.helpers import assert_sums_close, cluster_with_memory

RUNS = 10


def _pid():
    return os.getpid()


def graph():
    x = dx.random.normal((3000, 256), seed=11, dtype="float64")
    w = dx.random.uniform((256, 64), seed=12, dtype="float64") - 0.5
    return (dx.tanh(x @ w) * 2.0 + 1.0).sum(axis=1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_runs_survive_a_worker_killed_at_a_random_moment(tmp_path, monkeypatch):
    db_url = f"sqlite:///{tmp_path / 'deepx.db'}"  # the database is not what is tested here
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    db = open_db(db_url)
    y = graph()
    spec = cluster_with_memory(2**18, workers=4)  # small chunks: a few hundred tasks
    rng = random.Random(20261121)
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True,
                      memory_limit="1GiB", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        assert dx.compile(y, cluster=spec).stats().tasks >= 200
        dx.run(y, client=client, cluster=spec)  # warm-up
        began = time.perf_counter()
        reference = dx.run(y, client=client, cluster=spec)
        undisturbed_s = time.perf_counter() - began
        x = dx.run(dx.random.normal((3000, 256), seed=11, dtype="float64"), client=client)
        w = dx.run(dx.random.uniform((256, 64), seed=12, dtype="float64"), client=client) - 0.5
        terms = np.tanh(x @ w) * 2.0 + 1.0
        assert_sums_close(reference, terms.sum(axis=1), np.abs(terms).sum(axis=1), 1e-10)

        for attempt in range(RUNS):
            _wait_for_workers(client, 4)  # the nanny replaces the last victim (usually)
            pids = client.run(_pid)
            victim = rng.choice(sorted(pids))
            delay = rng.uniform(0.0, 0.5) * undisturbed_s
            killer = threading.Thread(target=_kill_while_running,
                                      args=(client, pids[victim], delay))
            killer.start()
            try:
                out = dx.run(y, client=client, cluster=spec)
            finally:
                killer.join()
            np.testing.assert_array_equal(out, reference, err_msg=f"run {attempt}")
            _wait_until_gone(client, victim)

        # Every run finished, and no chunk is recorded as held by a worker that is gone.
        with db.read() as s:
            runs = s.exec(select(Run.status)).all()
            held = s.exec(select(ChunkPlacement.worker).where(
                ChunkPlacement.state.in_(("memory", "spilled")))).all()
            hit = s.exec(select(Event.run_id).where(Event.kind == "worker-lost")).all()
        assert runs == ["succeeded"] * (RUNS + 4)
        # The kills landed while runs went (a kill between runs would test nothing).
        assert len(set(hit)) >= RUNS // 2, f"only {len(set(hit))} runs lost a worker"
        alive = set(client.scheduler_info()["workers"])
        assert set(held) <= alive, f"rows on dead workers: {set(held) - alive}"
    close_all()


def _kill_while_running(client, pid: int, delay: float, timeout: float = 60) -> None:
    """SIGKILL `pid` `delay` seconds after the run's first tasks start on the cluster."""
    deadline = time.monotonic() + timeout
    while not any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)


def _wait_for_workers(client, n: int, timeout: float = 30) -> None:
    """Wait for `n` workers; go on with fewer (at least 2) if a replacement is slow: the
    nanny sometimes takes long to restart a killed worker on this 2-core machine."""
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(client.scheduler_info()["workers"]) >= 2, "no worker was replaced"


def _wait_until_gone(client, worker: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while worker in client.scheduler_info()["workers"]:
        assert time.monotonic() < deadline, "the scheduler never noticed the killed worker"
        time.sleep(0.05)
