"""Every run a `dx.train` starts (its graphs of steps, its evaluations, its checkpoints) is
finished by that call: succeeded when it returns, failed or interrupted, with the reason,
when it raises. A checkpoint's run stayed `running` after the call returned, and the next
process to open the database marked it interrupted ("driver process died")."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Run, Training
from deepx_flow.meta.orphans import interrupt_orphaned_runs

RNG = np.random.default_rng(5)
X = RNG.standard_normal((120, 4))
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
MODEL = dx.nn.Sequential(dx.nn.Linear(4, 6, dtype="float64"), dx.nn.tanh,
                         dx.nn.Linear(6, 2, dtype="float64"))


def loss_fn(p, x, y):
    return dx.nn.cross_entropy(MODEL(p, x), y)


def runs_of(db) -> list[Run]:
    with db.read() as session:
        return list(session.exec(select(Run)))


def assert_nothing_left_running(db) -> None:
    """No run row says `running`: a process that finds every driver gone (as the next one
    after this process exits would) has nothing to mark interrupted."""
    assert [r for r in runs_of(db) if r.status == "running"] == []
    assert interrupt_orphaned_runs(db, started=lambda pid: None) == []


def test_every_run_is_finished_when_the_training_returns(client, tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    url = f"sqlite:///{tmp_path / 'deepx.db'}"
    fit = dx.train(loss_fn, MODEL.init(seed=1), data=(X, Y), batch_size=20, epochs=2,
                   steps_per_graph=2, checkpoint="small", checkpoint_every=4,
                   eval_data=(X[:40], Y[:40]), eval_every=4, progress=False, client=client,
                   db=url)
    db = open_db(url)
    runs = runs_of(db)
    assert fit.checkpoint is not None and fit.steps == 12
    # "run": the random initial parameters, computed by a run in the training's database
    assert {r.kind for r in runs} == {"run", "train", "evaluate", "checkpoint"}
    assert sum(r.kind == "checkpoint" for r in runs) == 3  # steps 4, 8 and 12
    assert {r.status for r in runs} == {"succeeded"} and all(r.ended_at for r in runs)
    assert_nothing_left_running(db)


def interrupting_loss(p, x, y, step=None):
    """The loss; while the graph of step 7 is built, Ctrl-C arrives (a real SIGINT to this
    process), with a checkpoint written and the graph of steps 5 and 6 submitted."""
    if step == 7:
        os.kill(os.getpid(), signal.SIGINT)
    return loss_fn(p, x, y)


def test_every_run_is_ended_by_a_training_that_is_interrupted(client, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    url = f"sqlite:///{tmp_path / 'deepx.db'}"
    with pytest.raises(KeyboardInterrupt):
        dx.train(interrupting_loss, MODEL.init(seed=1), data=(X, Y), batch_size=20,
                 epochs=2, steps_per_graph=2, checkpoint="small", checkpoint_every=4,
                 progress=False, client=client, db=url)
    db = open_db(url)
    runs = runs_of(db)
    assert {"train", "checkpoint"} <= {r.kind for r in runs}
    for r in runs:  # done before the interrupt, or ended by it
        assert r.status == "succeeded" or (r.status in ("failed", "interrupted")
                                           and "KeyboardInterrupt" in r.error), r
    assert_nothing_left_running(db)
    with db.read() as session:
        assert [t.status for t in session.exec(select(Training))] == ["failed"]


def test_every_run_is_ended_by_a_training_whose_step_fails(client, tmp_path, monkeypatch):
    """A learning rate far too large: the loss overflows after a few steps and checkpoints,
    and the training raises at that step."""
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    url = f"sqlite:///{tmp_path / 'deepx.db'}"
    w = {"w": np.ones((4, 1), np.float32)}
    target = X[:, :1].astype(np.float32)
    with pytest.raises(dx.ExecutionError, match="the loss is (inf|nan) at step"):
        dx.train(lambda p, x, y: dx.nn.mse(x @ p["w"], y), w,
                 data=(X.astype(np.float32), target * 3), batch_size=20, epochs=20,
                 steps_per_graph=2, checkpoint="diverging", checkpoint_every=2,
                 optimizer=dx.optim.SGD(lr=20.0), progress=False, client=client, db=url)
    db = open_db(url)
    runs = runs_of(db)
    assert sum(r.kind == "checkpoint" for r in runs) >= 1
    assert all(r.status in ("succeeded", "failed", "interrupted") for r in runs)
    assert_nothing_left_running(db)
