"""Recording at the edges: cancelled runs, keys shared by two runs, a database that cannot
be used, and `--db` placed before a subcommand."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import numpy as np
import pytest
from sqlalchemy import create_engine, text

import deepx_flow as dx
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all


@pytest.fixture
def record_db(db_url, monkeypatch):
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    yield open_db(db_url)
    close_all()


def _wait_for_status(db, run_id, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        run = queries.find_run(db, run_id)
        if run.status != "running" or time.monotonic() > deadline:
            return run
        time.sleep(0.1)


def test_a_persist_released_before_it_finishes_is_interrupted(client, record_db):
    slow = dx.random.normal((4000, 4000), seed=11, dtype="float64")
    p = dx.persist(dx.tanh(slow @ slow), client=client)
    p.release()
    (run,) = queries.list_runs(record_db)
    run = _wait_for_status(record_db, run.id)
    assert run.status == "interrupted" and "cancelled" in run.error


def test_a_chunk_belongs_to_the_run_that_computed_it(client, record_db):
    y = dx.random.uniform((600, 500), seed=12) * 4.0
    p = dx.persist(y, client=client).wait()
    began = time.monotonic()
    again = dx.run(y, client=client)  # same keys: nothing is recomputed
    assert time.monotonic() - began < 4  # no wait for a release that is not ours to make
    np.testing.assert_array_equal(again, p.to_numpy())
    persist_run = queries.list_runs(record_db)[-1]
    assert persist_run.kind == "persist"
    assert {r.run_id for r in dx.placement(p).rows} == {persist_run.id}
    p.release()
    rows = queries.placements(record_db, tensor=p.key, current=False)
    assert rows and {r.state for r in rows} == {"released"}


def test_the_placement_of_a_named_tensor_is_found_by_its_tensor(client, record_db):
    """A node the user named is keyed `op-_name@token` (its operator first, for Dask's task
    prefixes); `dx.placement(tensor)` finds its chunks all the same."""
    from deepx_flow.ir.keys import node_of
    x = dx.input("features", (400, 30), "float64")
    p = dx.persist(x * 2.0, inputs={"features": np.ones((400, 30))}, client=client).wait()
    rows = dx.placement(x, current=False).rows
    assert rows and {node_of(r.tensor) for r in rows} == {"features"}
    assert dx.placement(x, current=False).tensor.startswith("input-_features@")
    p.release()


def test_an_unusable_database_does_not_stop_the_run(client, tmp_path, monkeypatch, caplog):
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    open_db(url)
    close_all()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE deepx_schema SET version = version + 1"))
    engine.dispose()
    monkeypatch.setenv("DEEPX_DB_URL", url)
    with caplog.at_level(logging.WARNING):
        out = dx.run(dx.arange(12) * 3, client=client)
    np.testing.assert_array_equal(out, np.arange(12) * 3)
    assert any("not recorded" in r.getMessage() and "newer" in r.getMessage()
               for r in caplog.records)
    close_all()


def test_db_option_before_show(client, record_db, db_url):
    dx.run(dx.ones((5,)) + 1, client=client)
    (run,) = queries.list_runs(record_db)
    res = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "runs", "--db", db_url,
                          "show", run.id[:10]], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"run {run.id}" in res.stdout


def test_a_run_whose_driver_left_is_not_kept_going_on_the_scheduler(record_db):
    """A driver that goes without draining its run for the last time (its client closed,
    its process killed) leaves no run the scheduler's recorder keeps "going" for good (it
    would collect every later worker-lost event, for no one)."""
    from distributed import Client, LocalCluster

    def going(dask_scheduler=None):
        return sorted(dask_scheduler.plugins["deepx-recorder"].active)

    from deepx_flow.runtime import recorder_plugin
    from deepx_flow.runtime.recording import _install_plugins

    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as watcher:
        _install_plugins(watcher)
        driver = Client(cluster.scheduler_address, set_as_default=False)
        run_id = "a-run-never-drained"  # as a driver starts one, then is killed
        driver.run_on_scheduler(recorder_plugin.track, run_id=run_id, names={"x@0"},
                                store=record_db.identity, client=driver.id)
        assert run_id in watcher.run_on_scheduler(going)
        driver.close()
        deadline = time.monotonic() + 10
        while run_id in watcher.run_on_scheduler(going) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run_id not in watcher.run_on_scheduler(going)
