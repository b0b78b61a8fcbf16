"""The spec of a live cluster is kept per client while its workers stay the same
(`registry/membership.py`): runs after the first probe no worker; a worker that joins or
leaves, another database, or a worker process whose memory moved makes the next run probe
and register again."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.meta.models import Worker
from deepx_flow.registry import register
from deepx_flow.registry.membership import MEMORY_TOLERANCE, Membership
from deepx_flow.runtime.run import cluster_spec


@pytest.fixture
def probes(monkeypatch):
    """Counts the probes of a whole cluster made to register it."""
    calls = []
    real = register.probe_cluster

    def counted(client, wait=30.0):
        calls.append(client)
        return real(client, wait)
    monkeypatch.setattr(register, "probe_cluster", counted)
    return calls


@pytest.fixture
def record_db(tmp_path, monkeypatch):
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    monkeypatch.setenv("DEEPX_DB_URL", url)
    yield open_db(url)
    close_all()


def _wait_for(client, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(client.scheduler_info(n_workers=-1)["workers"]) != n:
        assert time.monotonic() < deadline, f"the cluster did not reach {n} workers"
        time.sleep(0.05)


def _rows(db) -> dict:
    with db.read() as session:
        return {w.address: w.status for w in session.exec(select(Worker)).all()}


def test_runs_probe_once_while_the_workers_stay(client, record_db, probes):
    x = dx.input("x", (200, 100), "float64")
    y = dx.exp(x).sum(axis=0)
    data = np.random.default_rng(0).standard_normal((200, 100))
    for _ in range(3):
        np.testing.assert_allclose(dx.run(y, inputs={"x": data}, client=client),
                                   np.exp(data).sum(axis=0), rtol=1e-12)
    assert len(probes) == 1  # a new database: registered once, then kept
    assert set(_rows(record_db).values()) == {"running"}


def test_a_worker_that_joins_or_leaves_is_seen_at_the_next_run(record_db, probes):
    x = dx.input("x", (300, 100), "float64")
    y = dx.tanh(x).sum(axis=1)
    data = np.random.default_rng(1).standard_normal((300, 100))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        dx.run(y, inputs={"x": data}, client=client)
        assert len(cluster_spec(None, client).workers) == 2 and len(probes) == 1
        cluster.scale(3)
        _wait_for(client, 3)
        out = dx.run(y, inputs={"x": data}, client=client)
        np.testing.assert_allclose(out, np.tanh(data).sum(axis=1), rtol=1e-12)
        assert len(probes) == 2 and len(cluster_spec(None, client).workers) == 3
        assert list(_rows(record_db).values()).count("running") == 3
        cluster.scale(1)
        _wait_for(client, 1)
        out = dx.run(y, inputs={"x": data}, client=client)
        np.testing.assert_allclose(out, np.tanh(data).sum(axis=1), rtol=1e-12)
        assert len(probes) == 3 and len(cluster_spec(None, client).workers) == 1
        assert sorted(_rows(record_db).values()) == ["gone", "gone", "running"]


def test_another_database_is_registered_in(client, tmp_path, monkeypatch, probes):
    y = dx.random.normal((100, 10), seed=5, dtype="float64").sum()
    for name in ("one.db", "two.db"):
        url = f"sqlite:///{(tmp_path / name).as_posix()}"
        monkeypatch.setenv("DEEPX_DB_URL", url)
        dx.run(y, client=client)
        assert set(_rows(open_db(url))) == set(client.scheduler_info(n_workers=-1)["workers"])
    assert len(probes) == 2
    close_all()


def test_what_counts_as_the_same_workers():
    w = ("tcp://10.0.0.1:4000", "Worker-a", "0", "10.0.0.1", 2, 4 * 2**30)
    base = Membership("Scheduler-1", (w,), {w[0]: 2**28})
    assert base.same_workers(Membership("Scheduler-1", (w,), {w[0]: 2**28 + 2**20}))
    moved = 2**28 + int(4 * 2**30 * MEMORY_TOLERANCE) + 1
    assert not base.same_workers(Membership("Scheduler-1", (w,), {w[0]: moved}))
    restarted = (w[0], "Worker-b", *w[2:])  # the same address, another process
    assert not base.same_workers(Membership("Scheduler-1", (restarted,), {w[0]: 2**28}))
    assert not base.same_workers(Membership("Scheduler-2", (w,), {w[0]: 2**28}))
    # A threaded worker lives in the driver's process: its memory is not the budget's.
    t = ("inproc://10.0.0.1/1/2", "Worker-c", "0", "10.0.0.1", 1, 2**30)
    assert Membership("S", (t,), {t[0]: 0}).same_workers(Membership("S", (t,), {t[0]: 2**31}))
