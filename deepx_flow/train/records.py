"""A training's rows in the metadata database: the training, its metrics per step, the runs
(graphs of steps) it submitted, and its checkpoints. Each call is one short transaction."""

from __future__ import annotations

import os
import socket
import time

from sqlalchemy import delete, insert, update
from sqlmodel import col, select

from deepx_flow.meta.db import Database
from deepx_flow.meta.models import Run, Training, TrainingCheckpoint, TrainingMetric


def begin(db: Database, training: Training) -> None:
    with db.session() as session:
        session.add(training)


def new_training(training_id: str, **fields) -> Training:
    return Training(id=training_id, started_at=time.time(), host=socket.gethostname(),
                    pid=os.getpid(), **fields)


def add_metrics(db: Database, training_id: str, rows: list[tuple[int, int, str, float]],
                steps_done: int | None = None) -> None:
    """Metric rows `(step, epoch, name, value)`; and how many steps are done, if given."""
    now = time.time()
    with db.begin() as conn:
        if rows:
            conn.execute(insert(TrainingMetric), [
                {"training_id": training_id, "step": s, "epoch": e, "name": n, "value": v,
                 "at": now} for s, e, n, v in rows])
        if steps_done is not None:
            conn.execute(update(Training).where(Training.id == training_id)
                         .values(steps_done=steps_done))


def forget_after(db: Database, training_id: str, step: int) -> None:
    """Delete the metrics of the steps after `step` (a training taking them again)."""
    with db.begin() as conn:
        conn.execute(delete(TrainingMetric).where(TrainingMetric.training_id == training_id,
                                                  TrainingMetric.step > step))


def link_run(db: Database, run_id: str, training_id: str) -> None:
    with db.begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(training_id=training_id))


def end(db: Database, training_id: str, status: str, error: str | None = None) -> None:
    with db.begin() as conn:
        conn.execute(update(Training).where(Training.id == training_id,
                                            Training.status == "running")
                     .values(status=status, ended_at=time.time(), error=error))


def add_checkpoint(db: Database, row: TrainingCheckpoint) -> None:
    with db.session() as session:
        session.add(row)


def latest_checkpoint(db: Database, asset: str, config_hash: str) -> TrainingCheckpoint | None:
    """The newest checkpoint in `asset` of a training configured as `config_hash`."""
    with db.read() as session:
        return session.exec(
            select(TrainingCheckpoint).where(TrainingCheckpoint.asset == asset,
                                             TrainingCheckpoint.config_hash == config_hash)
            .order_by(col(TrainingCheckpoint.step).desc(), col(TrainingCheckpoint.id).desc())
            .limit(1)).first()


def metrics(db: Database, training_id: str) -> dict[str, list[tuple[int, float]]]:
    """Metric name -> (step, value) pairs in step order."""
    out: dict[str, list[tuple[int, float]]] = {}
    with db.read() as session:
        for row in session.exec(select(TrainingMetric)
                                .where(TrainingMetric.training_id == training_id)
                                .order_by(col(TrainingMetric.name), col(TrainingMetric.step),
                                          col(TrainingMetric.id))):
            out.setdefault(row.name, []).append((row.step, row.value))
    return out


def training_of_run(db: Database, run_id: str) -> Training | None:
    with db.read() as session:
        run = session.get(Run, run_id)
        return session.get(Training, run.training_id) if run and run.training_id else None


def get(db: Database, training_id: str) -> Training | None:
    with db.read() as session:
        return session.get(Training, training_id)
