"""A worker killed mid-training: the run goes on and ends with the parameters of a run
that lost nothing; the scheduler keeps no more than the last steps' tasks."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import numpy as np
import pytest
from sqlmodel import func, select

import deepx_flow as dx
from deepx_flow.meta import open_db
from deepx_flow.meta.models import TrainingMetric


@pytest.fixture
def process_cluster():
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        yield client


def _train(client, db):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2000, 8))
    y = (x[:, 0] + x[:, 3] > 0).astype(np.int64)
    model = dx.nn.Sequential(dx.nn.Linear(8, 16, dtype="float64"), dx.nn.tanh,
                             dx.nn.Linear(16, 2, dtype="float64"))
    return dx.train(lambda p, a, b: dx.nn.cross_entropy(model(p, a), b), model.init(seed=3),
                    data=(x, y), batch_size=20, epochs=2, steps_per_graph=5, progress=False,
                    client=client, db=db)


@pytest.fixture(scope="module")
def unbroken(client, tmp_path_factory):
    """The training of `_train` on the shared client, losing nothing: what the runs sent
    back below must end with (trained once for them all)."""
    return _train(client, f"sqlite:///{tmp_path_factory.mktemp('unbroken') / 'deepx.db'}")


@pytest.mark.timeout(600)
def test_a_worker_killed_mid_training_changes_nothing(process_cluster, tmp_path):
    client = process_cluster
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    held, stop = [0], threading.Event()

    def count_tasks():  # the most tasks the scheduler holds at once
        while not stop.wait(0.05):
            n = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
            held[0] = max(held[0], n)

    counter = threading.Thread(target=count_tasks, daemon=True)
    counter.start()
    unbroken = _train(client, db)
    stop.set()
    counter.join(5)

    killed = []

    def kill_a_worker_mid_run():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.1)
            with open_db(db).read() as s:
                rows = s.exec(select(func.count()).select_from(TrainingMetric)).one()
            # The second training's metrics: past step 60 of its 200.
            if rows > 4 * (200 + 60):
                pid = next(iter(client.run(os.getpid).values()))
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return

    killer = threading.Thread(target=kill_a_worker_mid_run, daemon=True)
    killer.start()
    fit = _train(client, db)
    killer.join(5)
    assert killed, "the worker was not killed before the training ended"
    assert fit.steps == 200
    for k in unbroken.values:
        np.testing.assert_array_equal(fit.values[k], unbroken.values[k])
    # Every 64 steps the next graph starts from data and the scheduler forgets the steps
    # before: it never held the tasks of the 200 steps at once (nor half of them).
    with open_db(db).read() as s:
        from deepx_flow.meta.models import Run, Training
        first = s.exec(select(Training.id).order_by(Training.started_at)).first()
        runs = s.exec(select(Run.n_tasks).where(Run.training_id == first)).all()
    per_step = sum(runs) / 200
    assert 0 < held[0] < 100 * per_step, (held[0], per_step)


def test_values_lost_past_recomputing_send_the_run_back_to_its_last_cut(client, unbroken,
                                                                        monkeypatch, tmp_path):
    """What Dask does when a worker dies holding values whose lineage it let go: it cancels
    the futures that need them. The run goes back to the last values the driver holds (a
    lineage cut every 4 steps here), takes the steps again, and ends as an unbroken run,
    with each step once in its history and in the database."""
    from distributed.client import FutureCancelledError

    from deepx_flow.train import loop, records
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    monkeypatch.setattr(loop, "LINEAGE_STEPS", 4)
    real, calls = loop._collect, [0]

    def collect_losing_one(submitted, *args):
        calls[0] += 1
        if calls[0] in (7, 19):  # past a cut, twice
            for fs in submitted[1].values():
                for f in fs:
                    f.cancel()
            raise FutureCancelledError(submitted[1]["loss"][0].key, "lost dependencies")
        return real(submitted, *args)

    monkeypatch.setattr(loop, "_collect", collect_losing_one)
    fit = _train(client, db)
    assert calls[0] > 40  # 200 steps of 5 per graph, some taken twice
    assert [h["step"] for h in fit.history] == list(range(1, 201))
    for k in unbroken.values:
        np.testing.assert_array_equal(fit.values[k], unbroken.values[k])
    stored = records.metrics(open_db(db), fit.training_id)
    assert [s for s, _ in stored["loss"]] == list(range(1, 201))


def test_values_lost_while_gathering_the_result_also_send_the_run_back(client, unbroken,
                                                                       monkeypatch, tmp_path):
    """Gathering raises a cancellation as the cause of an ExecutionError: that too is lost
    values, and the run goes back to its last cut rather than failing."""
    from distributed.client import FutureCancelledError

    from deepx_flow.errors import ExecutionError
    from deepx_flow.train import loop
    db = f"sqlite:///{tmp_path / 'deepx.db'}"
    real, calls = loop._Runner.gather, [0]

    def gather_losing_once(self):
        calls[0] += 1
        if calls[0] == 1:
            try:
                raise FutureCancelledError("x", "lost dependencies")
            except FutureCancelledError as err:
                raise ExecutionError(f"a task failed: {err}") from err
        return real(self)

    monkeypatch.setattr(loop._Runner, "gather", gather_losing_once)
    fit = _train(client, db)
    assert calls[0] == 2
    assert [h["step"] for h in fit.history] == list(range(1, 201))
    for k in unbroken.values:
        np.testing.assert_array_equal(fit.values[k], unbroken.values[k])
    # An ExecutionError of another cause is not taken for lost values.
    monkeypatch.setattr(loop._Runner, "gather",
                        lambda self: (_ for _ in ()).throw(ExecutionError("a kernel failed")))
    with pytest.raises(ExecutionError, match="a kernel failed"):
        _train(client, db)
