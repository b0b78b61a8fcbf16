"""A run's recorded end comes after every task of it, and every task that finishes has its
row in its run, whatever happens after the run ends.

A training's graph of steps was ended when its losses were back, while the tasks taking out
its parameters still ran: its `ended_at` was before its last tasks' ends, and their rows came
after the run's end, handed to whichever run drained next; a run that held no chunks when it
ended never had them written at all. A checkpoint's write tasks and the random initial
parameters of a `dx.train(db=...)` were not in the training's database either.

Every test here counts, with a scheduler plugin of its own, the tasks the scheduler saw
finish, and compares them with the task rows: none lost, none twice.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin

import deepx_flow as dx
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all

REPO = Path(__file__).resolve().parents[2]


class Finished(SchedulerPlugin):
    """The key of every task the scheduler saw finish (memory or erred), once per time."""

    name = "test-finished"

    def __init__(self):
        self.done: list = []

    def transition(self, key, start, finish, *args, **kwargs):
        if start == "processing" and finish in ("memory", "erred"):
            self.done.append(str(key))


def _take_finished(dask_scheduler):
    plugin = dask_scheduler.plugins["test-finished"]
    done, plugin.done = plugin.done, []
    return done


@pytest.fixture(scope="module")
def cluster():
    """Two threaded workers of their own: no other test's tasks run there."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        client.register_plugin(Finished())
        yield cluster, client


@pytest.fixture
def client(cluster):
    cluster[1].run_on_scheduler(_take_finished)  # what an earlier test left
    return cluster[1]


@pytest.fixture
def record_db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'deepx.db'}"
    monkeypatch.setenv("DEEPX_DB_URL", url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    yield open_db(url)
    close_all()


def task_rows(db) -> list:
    return [t for r in queries.list_runs(db, limit=10_000) for t in queries.run_tasks(db, r.id)]


def assert_every_task_recorded_within_its_run(db, finished: list) -> list:
    """Every task the scheduler saw finish has one row, in a run that ended after it; the
    runs, returned, all ended."""
    rows = Counter(t.key for t in task_rows(db) if t.status in ("memory", "erred"))
    ran = Counter(finished)
    assert rows == ran, (f"{sum((ran - rows).values())} tasks with no row, e.g. "
                         f"{sorted(ran - rows)[:3]}; {sum((rows - ran).values())} rows too many")
    runs = queries.list_runs(db, limit=10_000)
    for run in runs:
        assert run.status != "running" and run.ended_at is not None, run
        for t in queries.run_tasks(db, run.id):
            if t.stop is not None:
                assert t.stop <= run.ended_at, (run.kind, run.id, t.key, t.stop - run.ended_at)
    return runs


RNG = np.random.default_rng(5)
X = RNG.standard_normal((120, 4))
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
MODEL = dx.nn.Sequential(dx.nn.Linear(4, 6, dtype="float64"), dx.nn.tanh,
                         dx.nn.Linear(6, 2, dtype="float64"))


def loss_fn(p, x, y):
    return dx.nn.cross_entropy(MODEL(p, x), y)


def test_a_training_records_every_task_within_its_run(client, tmp_path, monkeypatch):
    """Graphs of two steps each, evaluations and checkpoints, the initial parameters random
    (computed by a run of their own), recorded in the database given as `db=` (another one
    is the default)."""
    url = f"sqlite:///{tmp_path / 'training.db'}"
    monkeypatch.setenv("DEEPX_DB_URL", f"sqlite:///{tmp_path / 'default.db'}")
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    try:
        fit = dx.train(loss_fn, MODEL.init(seed=1), data=(X, Y), batch_size=20, epochs=2,
                       steps_per_graph=2, checkpoint="small", checkpoint_every=4,
                       eval_data=(X[:40], Y[:40]), eval_every=4, progress=False,
                       client=client, db=url)
        finished = client.run_on_scheduler(_take_finished)
        assert fit.steps == 12
        runs = assert_every_task_recorded_within_its_run(open_db(url), finished)
        kinds = Counter(r.kind for r in runs)
        assert kinds == {"run": 1, "train": 6, "evaluate": 3, "checkpoint": 3}, kinds
        for run in runs:
            tasks = queries.run_tasks(open_db(url), run.id)
            assert tasks and "?" not in {t.operator for t in tasks}, run.kind
            if run.kind == "checkpoint":  # the chunks it packs, and their writes
                assert "store[zarr]" in {t.operator for t in tasks}
        assert queries.list_runs(open_db(f"sqlite:///{tmp_path / 'default.db'}")) == []
    finally:
        close_all()


def test_a_run_and_a_persist_record_every_task_within_their_runs(client, record_db):
    x = dx.random.normal((600, 400), seed=2, dtype="float64")
    y = dx.tanh(x @ x.T) @ x
    got = dx.run(y.sum(axis=0), client=client)
    p = dx.persist(dx.exp(y * 1e-3), client=client).wait()
    kept = p.to_numpy()
    p.release()
    xs = dx.run(x, client=client)
    finished = client.run_on_scheduler(_take_finished)
    runs = assert_every_task_recorded_within_its_run(record_db, finished)
    assert sorted(r.kind for r in runs) == ["persist", "run", "run"]
    assert {r.status for r in runs} == {"succeeded"}
    want = np.tanh(xs @ xs.T) @ xs
    np.testing.assert_allclose(got, want.sum(axis=0), rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(kept, np.exp(want * 1e-3), rtol=1e-12)


def slow_graph(seed: int):
    x = dx.random.normal((1500, 1500), seed=seed, dtype="float64")
    return dx.tanh(x @ x) @ x  # seconds of work on two threads


def holds_no_chunk(dask_scheduler, run_id) -> bool:
    plugin = dask_scheduler.plugins["deepx-recorder"]
    return run_id not in set(plugin.owner.values())


def test_a_run_known_to_succeed_before_its_last_tasks_ends_after_them(client, record_db):
    """A run's outcome is known from some of its outputs (a training's graph: its losses)
    while its other tasks still run: it ends once they have, after the last of them (it
    ended seconds before them)."""
    from distributed import wait

    from deepx_flow.runtime.run import _submit
    plan = dx.compile({"slow": slow_graph(6), "quick": dx.arange(3) * 2.0}, cluster=None)
    futures, _, recorder, _ = _submit(plan, plan.graph, {}, client, "run", db=record_db)
    recorder.watch(futures["quick"])  # succeeded once this is computed
    wait(futures["slow"])
    recorder.finish()  # as dx.train ends its runs when it returns: waits for the end
    dx.run(dx.arange(5) * 2.0, client=client)  # another run drains what came since
    finished = client.run_on_scheduler(_take_finished)
    runs = assert_every_task_recorded_within_its_run(record_db, finished)
    assert {r.status for r in runs} == {"succeeded"}
    run = next(r for r in runs if r.id == recorder.run_id)
    last = max(t.stop for t in queries.run_tasks(record_db, run.id))
    # It ended when its last task did (its outcome was known long before), not a drain later.
    assert run.ended_at - last < 0.5 * (run.ended_at - run.started_at)


def test_tasks_that_finish_after_their_run_ended_are_written(client, record_db):
    """A run ended (interrupted) while its tasks wait, holding no chunk: the tasks finishing
    afterwards are written in it by the next drain, of any run in the database (they were
    never written)."""
    from distributed import wait

    from deepx_flow.runtime.run import _submit
    plan = dx.compile(slow_graph(4), cluster=None)
    # Both worker threads busy for a while: the run's tasks wait behind these.
    workers = sorted(client.scheduler_info()["workers"])
    busy = [client.submit(time.sleep, 5, key=f"busy-{i}", workers=[w], pure=False)
            for i, w in enumerate(workers)]
    futures, _, recorder, _ = _submit(plan, plan.graph, {}, client, "run", db=record_db)
    recorder.watch()
    recorder.finish("stopped by the test", status="interrupted")
    assert client.run_on_scheduler(holds_no_chunk, run_id=recorder.run_id)
    (run,) = queries.list_runs(record_db)
    assert run.status == "interrupted"
    wait(busy + [f for fs in futures.values() for f in fs])  # they finish after its end
    dx.run(dx.arange(5) * 2.0, client=client)  # another run drains what came since
    finished = [k for k in client.run_on_scheduler(_take_finished) if "busy-" not in k]
    rows = Counter(t.key for t in task_rows(record_db) if t.status == "memory")
    assert rows == Counter(finished)
    mine = {t.key for t in queries.run_tasks(record_db, run.id)}
    assert {str(f.key) for fs in futures.values() for f in fs} <= mine


def test_tasks_finishing_after_their_run_are_written_when_the_process_exits(cluster,
                                                                             record_db):
    """A driver process ends its run (interrupted) while its tasks run, waits for them and
    exits at once: the rows of the tasks that finished after the run ended are written as it
    exits (nobody else records into this database)."""
    scheduler = cluster[0].scheduler_address
    cluster[1].run_on_scheduler(_take_finished)
    script = textwrap.dedent(f"""
        import deepx_flow as dx
        from distributed import Client, wait
        from deepx_flow.meta import open_db
        from deepx_flow.runtime.run import _submit
        client = Client({scheduler!r})
        x = dx.random.normal((1500, 1500), seed=5, dtype="float64")
        plan = dx.compile(dx.tanh(x @ x) @ x, cluster=None)
        futures, _, recorder, _ = _submit(plan, plan.graph, {{}}, client, "run",
                                          db=open_db({record_db.url!r}))
        recorder.watch()
        recorder.finish("stopped by the script", status="interrupted")
        wait([f for fs in futures.values() for f in fs])
    """)
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    finished = cluster[1].run_on_scheduler(_take_finished)
    (run,) = queries.list_runs(record_db)
    assert run.status == "interrupted"
    rows = Counter(t.key for t in queries.run_tasks(record_db, run.id) if t.status == "memory")
    assert rows == Counter(finished) and len(rows) > 0
