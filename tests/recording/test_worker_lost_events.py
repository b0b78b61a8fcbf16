"""Every worker lost during a run is a "worker-lost" event of that run, exactly once, whether
or not it held a chunk of the run at that moment: a series of runs, each losing a worker
process killed with SIGKILL while it computes a task of the run (at the run's start, before
it holds anything, or later), on SQLite and PostgreSQL."""

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

import deepx_flow as dx
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all
from tests.helpers import cluster_with_memory

# Kills per database: the events are the same code on both, the second only checks they land.
KILLS = {"sqlite": 6, "postgresql": 3}


@pytest.fixture
def record_db(db_url, monkeypatch):
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    yield open_db(db_url)
    close_all()


def _pid():
    return os.getpid()


def graph():
    x = dx.random.normal((3000, 256), seed=11, dtype="float64")
    w = dx.random.uniform((256, 64), seed=12, dtype="float64") - 0.5
    return x, w, (dx.tanh(x @ w) * 2.0 + 1.0).sum(axis=1)


def _kill_while_computing(client, victim: str, pid: int, delay: float, run_done, killed: list):
    """SIGKILL `pid` once the run's tasks are running, `delay` seconds later, at a moment
    the victim is computing one of them (so the run cannot end without noticing). A run that
    ends first is left alone: killing the worker after it would be no loss of that run."""
    deadline = time.monotonic() + 60
    while not any(client.processing().values()) and not run_done.is_set():
        assert time.monotonic() < deadline, "the run's tasks never started"
        time.sleep(0.005)
    run_done.wait(delay)
    while not client.processing(workers=[victim]).get(victim):
        if run_done.is_set():
            return
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    killed.append(victim)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_worker_killed_during_a_run_is_one_event_of_it(record_db, db_url):
    kills = KILLS[db_url.split(":")[0].split("+")[0]]
    x, w, y = graph()
    spec = cluster_with_memory(2**18, workers=4)  # a few hundred tasks
    rng = random.Random(20261122)
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, memory_limit="1GiB",
                      dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        xv, wv = dx.run([x, w], client=client)
        reference = (np.tanh(xv @ wv) * 2.0 + 1.0).sum(axis=1)
        # The killed runs reuse the plan of these: time the second, which has no planning in it,
        # so that a delayed kill lands well before the run ends.
        undisturbed_s = []
        for _ in range(2):
            began = time.perf_counter()
            np.testing.assert_allclose(dx.run(y, client=client, cluster=spec,
                                              recovery=dx.Recovery(speculate=False)),
                                       reference, rtol=1e-10)
            undisturbed_s.append(time.perf_counter() - began)
        expected = [[], [], []]  # per run: the workers it lost
        while len([lost for lost in expected if lost]) < kills:
            assert len(expected) < 3 + 3 * kills, f"runs ended before their kills: {expected}"
            deadline = time.monotonic() + 60
            while len(client.scheduler_info()["workers"]) < 4:  # the nanny replaced the last
                assert time.monotonic() < deadline, "a killed worker was not replaced"
                time.sleep(0.05)
            pids = client.run(_pid)
            victim = rng.choice(sorted(pids))
            # Half the kills come at once: the victim holds no chunk of the run yet.
            delay = 0.0 if len(expected) % 2 else rng.uniform(0.1, 0.4) * min(undisturbed_s)
            killed, run_done = [], threading.Event()
            killer = threading.Thread(target=_kill_while_computing,
                                      args=(client, victim, pids[victim], delay, run_done, killed))
            killer.start()
            try:
                # No speculative backups: a task the victim computes beside its backup is
                # not needed by the run, which could then end before the loss is noticed.
                out = dx.run(y, client=client, cluster=spec,
                             recovery=dx.Recovery(speculate=False))
            finally:
                run_done.set()
                killer.join()
            np.testing.assert_allclose(out, reference, rtol=1e-10, err_msg=f"run {len(expected)}")
            expected.append(killed)
            if killed:
                # The next round asks every listed worker for its pid: wait until the scheduler
                # has dropped the dead one (on a busy machine it can notice after the run ends).
                deadline = time.monotonic() + 60
                while victim in client.scheduler_info()["workers"]:
                    assert time.monotonic() < deadline, f"{victim} was killed but is still listed"
                    time.sleep(0.05)

    runs = sorted(queries.list_runs(record_db, limit=100), key=lambda r: r.started_at)
    assert [r.status for r in runs] == ["succeeded"] * len(expected)
    for run, victims in zip(runs, expected):
        lost = [e.worker for e in queries.run_events(record_db, run.id)
                if e.kind == "worker-lost"]
        assert lost == victims, f"run {run.id[:8]} lost {victims}, events name {lost}"
