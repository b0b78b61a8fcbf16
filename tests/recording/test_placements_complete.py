"""Every task that finishes has its placement row: the chunk it made, on the worker that made
it, with the bytes the task reported, in the run that computed it, whatever happened to the
chunk afterwards (released between two drains, gathered and dropped at the end, computed
again by a later run of the same graph). And a persist whose values were gathered before its
cluster closed is recorded as what it was: succeeded. On SQLite and PostgreSQL."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

import deepx_flow as dx
from deepx_flow.ir.keys import chunk_index
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all
from tests.helpers import cluster_with_memory

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def record_db(db_url, monkeypatch):
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    yield open_db(db_url)
    close_all()


def unplaced(db, run_id: str) -> list[tuple]:
    """(tensor, chunk, worker) of the run's finished tasks whose chunk has no placement row
    in the run, or one whose size differs from what the task reported."""
    rows = {(p.tensor, p.chunk, p.worker): p
            for p in queries.placements(db, run_id=run_id, current=False)}
    missing = []
    for task in queries.run_tasks(db, run_id):
        if task.status != "memory":
            continue
        where = (task.tensor, chunk_index(ast.literal_eval(task.key)), task.worker)
        if where not in rows or rows[where].nbytes != task.bytes_out:
            missing.append(where)
    return missing


def finished_tasks(db, run_id: str) -> int:
    return sum(t.status == "memory" for t in queries.run_tasks(db, run_id))


@pytest.mark.slow
def test_the_cli_run_of_mlp_forward_places_every_task(db_url, tmp_path):
    x = np.random.default_rng(0).standard_normal((200_000, 512), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    del x
    res = subprocess.run(
        [sys.executable, "-m", "deepx_flow.cli.main", "run", str(REPO / "graphs" /
         "mlp_forward.yaml"), "-i", f"x={tmp_path / 'x.npy'}", "--db", db_url],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    db = open_db(db_url)
    (run,) = queries.list_runs(db)
    assert run.status == "succeeded"
    assert finished_tasks(db, run.id) >= 20  # h, partial sums, logits, probs in chunks
    assert unplaced(db, run.id) == []
    # dx.run gathered its outputs and dropped everything: nothing of it is held now.
    assert {p.state for p in queries.placements(db, run_id=run.id, current=False)} == \
        {"released"}


def graphs():
    x = dx.random.normal((3000, 256), seed=11, dtype="float64")
    w = dx.random.uniform((256, 64), seed=12, dtype="float64") - 0.5
    h = dx.tanh(x @ w) * 2.0 + 1.0
    return {"mlp": h.sum(axis=1), "softmax": dx.softmax(h, axis=-1).T + 1.0,
            "total": (x * x).sum()}


@pytest.mark.parametrize("name", ["mlp", "softmax", "total"])
def test_each_run_of_a_graph_places_every_task(client, record_db, name):
    """Small chunks (hundreds of tasks, most dropped before the next drain), run twice on the
    same workers: the second run computes the same keys again, and both keep their rows."""
    y = graphs()[name]
    spec = cluster_with_memory(2**18, workers=2)
    first = dx.run(y, client=client, cluster=spec)
    again = dx.run(y, client=client, cluster=spec)
    np.testing.assert_array_equal(first, again)
    runs = queries.list_runs(record_db)
    assert len(runs) == 2 and {r.status for r in runs} == {"succeeded"}
    for run in runs:
        assert finished_tasks(record_db, run.id) >= 30
        assert unplaced(record_db, run.id) == []


def test_a_persist_gathered_before_its_cluster_closed_succeeded(client, record_db):
    x = dx.random.normal((2000, 300), seed=4, dtype="float64")
    y = dx.relu(x - 0.25) * 3.0
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as own:
        p = dx.persist(y, client=own, cluster=cluster_with_memory(2**18, workers=2))
        got = p.to_numpy()
    xv = dx.run(x, client=client)
    np.testing.assert_array_equal(got, np.maximum(xv - 0.25, 0.0) * 3.0)
    (run,) = [r for r in queries.list_runs(record_db) if r.kind == "persist"]
    assert (run.status, run.error) == ("succeeded", None)
    assert finished_tasks(record_db, run.id) >= 20
    assert unplaced(record_db, run.id) == []


def test_a_persist_dropped_after_its_run_is_recorded_by_the_next_run(client, record_db,
                                                                      tmp_path, caplog):
    """A persisted tensor whose futures are dropped without `release` (a handle garbage
    collected, a notebook cell run again): its chunks are recorded released by the next run
    that records into the same database, and never written into another database."""
    p = dx.persist(dx.random.uniform((900, 300), seed=21) + 2.0, client=client).wait()
    (persisted,) = queries.list_runs(record_db)
    held = queries.placements(record_db, run_id=persisted.id)
    assert held and {(r.tensor, r.state) for r in held} == {(p.key, "memory")}
    for future in p.futures:  # dropped behind the recorder's back
        future.release()
    p.futures = []

    other = f"sqlite:///{(tmp_path / 'other.db').as_posix()}"
    caplog.set_level(logging.WARNING, logger="deepx_flow.runtime.recording")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEEPX_DB_URL", other)
        np.testing.assert_array_equal(dx.run(dx.arange(6) * 2.0, client=client),
                                      np.arange(6) * 2.0)
    # The persist's rows were not offered to the other database (they would fail its
    # foreign key, and with them the whole batch).
    assert not [r for r in caplog.records if r.name == "deepx_flow.runtime.recording"]
    assert queries.placements(open_db(other), run_id=persisted.id, current=False) == []
    assert queries.placements(record_db, run_id=persisted.id) == held  # not written yet

    dx.run(dx.arange(6) * 3.0, client=client)
    rows = queries.placements(record_db, run_id=persisted.id, tensor=p.key, current=False)
    assert [(r.chunk, r.worker, r.nbytes) for r in rows] == \
        [(r.chunk, r.worker, r.nbytes) for r in held]
    assert {r.state for r in rows} == {"released"}
