"""A task's recorded times are those of the attempt that just finished, inside its run.

A worker keeps a key's state while it holds the key, and Dask appends each computation of
it to that state's `startstops`; a key that a later graph computes again on the same worker
(the constant learning rate that every graph of a `dx.train` reads, content-addressed to one
key) reported every earlier computation too. Recorded from the first to the last, an input
of 0.1 ms was credited seconds of compute, and started before its run did. And a task
that runs a training step's grouped members names them (it was "?").
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all


@pytest.fixture
def record_db(db_url, monkeypatch):
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    yield open_db(db_url)
    close_all()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_task_of_a_training_lies_within_its_run(client, record_db):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = dx.nn.Linear(6, 2)
    fit = dx.train(lambda p, a, b: dx.nn.cross_entropy(model(p, a), b), model.init(seed=1),
                   data=(x, y), batch_size=25, epochs=2, steps_per_graph=2, progress=False,
                   client=client)
    assert fit.steps == 16
    runs = [r for r in queries.list_runs(record_db, limit=100) if r.kind == "train"]
    assert len(runs) == 8  # the learning rate's key is the same in every one of them
    inputs_seen = 0
    for run in runs:
        tasks = [t for t in queries.run_tasks(record_db, run.id) if t.start is not None]
        assert tasks
        # Every task names what it ran: a grouped step by the operators in it (it was "?").
        operators = {t.operator for t in tasks}
        assert "?" not in operators
        assert any(o.startswith("group[") and "matmul" in o for o in operators), operators
        for t in tasks:
            # One clock here (threaded workers in this process): no margin is needed. (A
            # run of dx.train has its outcome when its losses are back, and ends once the
            # tasks taking out its parameters have too.)
            assert run.started_at <= t.start <= t.stop <= run.ended_at, (run.id, t.key)
            if t.operator == "input":
                inputs_seen += 1
                # A 0-d array handed over: far under the run's own length.
                assert t.stop - t.start < 0.5 * (run.ended_at - run.started_at), t.key
    # A graph submitted while the one before still holds the learning rate's key takes it
    # from there and computes no input task; how many do depends on timing (two of eight on
    # a busy CI machine). Two seen means one was computed again after an earlier one.
    assert inputs_seen >= 2


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_task_that_ends_after_its_run_is_named_by_that_runs_operators(client, record_db):
    """A run can end before all its tasks do (one interrupted while its tasks run, that
    holds a chunk already); their records are then written by whichever run drains next, of
    another graph: they named no operator ("?")."""
    from distributed import wait

    from deepx_flow.ir.program import operator_label
    from deepx_flow.runtime.run import _submit
    x = dx.random.normal((1500, 1500), seed=4, dtype="float64")
    slow = dx.tanh(x @ x) @ x  # seconds of work on two threads
    plan = dx.compile(slow, cluster=None)
    futures, _, recorder, _ = _submit(plan, plan.graph, {}, client, "run", db=record_db)

    def holds_a_chunk(dask_scheduler, run_id):
        plugin = dask_scheduler.plugins["deepx-recorder"]
        return run_id in set(plugin.owner.values())
    deadline = time.monotonic() + 60  # as a training's graph holds its earlier steps' chunks
    while not client.run_on_scheduler(holds_a_chunk, run_id=recorder.run_id):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    recorder.finish("stopped by the test", status="interrupted")  # its tasks still running
    (run,) = queries.list_runs(record_db)
    assert run.status == "interrupted"
    early = len(queries.run_tasks(record_db, run.id))
    wait([f for fs in futures.values() for f in fs])
    dx.run(dx.arange(5) * 2.0, client=client)  # another graph's run drains what came since
    tasks = queries.run_tasks(record_db, run.id)
    labels = {operator_label(n) for n in plan.fused.nodes}
    assert len(tasks) > early and {t.operator for t in tasks} <= labels
