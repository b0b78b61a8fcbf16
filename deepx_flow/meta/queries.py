"""Reading runs, tasks and chunk placements back, for the CLI, `dx.placement` and the
dashboard. Each function is one short read; results are plain model objects."""

from __future__ import annotations

import math
from collections import namedtuple

from sqlalchemy import BigInteger, case, cast, func
from sqlmodel import col, select

from deepx_flow.errors import InputError
from deepx_flow.meta.db import Database
from deepx_flow.meta.models import ChunkPlacement, Event, Run, Task


def plain_rows(result) -> list:
    """The rows of a SQLAlchemy result as named tuples. A SQLAlchemy Row finds an attribute
    by name in Python, about 0.7 us each: a page reading 10,000 rows of 8 columns spent
    60 ms on that alone, a named tuple's attributes cost almost nothing."""
    Row = namedtuple("Row", result.keys())
    return [Row._make(row) for row in result]


def list_runs(db: Database, limit: int = 20, status: str | None = None) -> list[Run]:
    """The most recent runs first."""
    query = select(Run).order_by(col(Run.started_at).desc()).limit(limit)
    if status:
        query = query.where(Run.status == status)
    with db.read() as session:
        return list(session.exec(query))


def find_run(db: Database, run_id: str) -> Run:
    """The run whose id is `run_id` or starts with it (as `deepx-flow runs` prints it)."""
    with db.read() as session:
        run = session.get(Run, run_id)
        if run is not None:
            return run
        prefix = col(Run.id).startswith(run_id, autoescape=True)
        matches = list(session.exec(select(Run).where(prefix).limit(2))) if run_id else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise InputError(f"no run {run_id!r} in {db.display_url} (deepx-flow runs lists them)")
    raise InputError(f"run id {run_id!r} is ambiguous in {db.display_url}; give more of it")


def run_tasks(db: Database, run_id: str, limit: int | None = None) -> list[Task]:
    """The run's task rows by start (the first `limit` of them)."""
    with db.read() as session:
        return list(session.exec(select(Task).where(Task.run_id == run_id)
                                 .order_by(col(Task.start), col(Task.id)).limit(limit)))


def timeline_rows(db: Database, run_id: str, limit: int) -> list:
    """What a timeline draws of the run's first `limit` task rows by start: worker, start,
    stop, status, operator, key, attempts, and the first 300 characters of the error (rows
    with attribute access; not whole Task objects, which cost 2x more to read)."""
    query = (select(Task.worker, Task.start, Task.stop, Task.status, Task.operator,
                    Task.key, Task.attempts, func.substr(Task.error, 1, 300).label("error"))
             .where(Task.run_id == run_id).order_by(col(Task.start), col(Task.id))
             .limit(limit))
    with db.read() as session:
        return plain_rows(session.connection().execute(query))


def task_summary(db: Database, run_id: str) -> list[tuple]:
    """Per operator: tasks, failed tasks, compute seconds, seconds spent fetching inputs
    from other workers (None for runs recorded before that was), bytes out."""
    failed = func.sum(case((Task.status == "erred", 1), else_=0))
    query = (select(Task.operator, func.count(), failed,
                    func.sum(func.coalesce(Task.stop - Task.start, 0.0)),
                    func.sum(Task.comm_seconds),
                    # PostgreSQL sums BIGINTs as NUMERIC (a Decimal in Python)
                    cast(func.sum(func.coalesce(Task.bytes_out, 0)), BigInteger))
             .where(Task.run_id == run_id).group_by(Task.operator)
             .order_by(Task.operator))
    with db.read() as session:
        return [tuple(row) for row in session.exec(query)]


def measured_ratio(summary: list[tuple]) -> float | None:
    """The compute/communication ratio a run reached, from its `task_summary`: seconds of
    compute over seconds of fetching inputs (inf when nothing was fetched; None when no
    task recorded either)."""
    compute = sum(row[3] or 0.0 for row in summary)
    fetched = [row[4] for row in summary if row[4] is not None]
    if not fetched:
        return None
    return compute / sum(fetched) if sum(fetched) > 0 else math.inf


def run_events(db: Database, run_id: str) -> list[Event]:
    with db.read() as session:
        return list(session.exec(select(Event).where(Event.run_id == run_id)
                                 .order_by(col(Event.at))))


def placements(db: Database, *, run_id: str | None = None, tensor: str | None = None,
               node_key: str | None = None, current: bool = True) -> list[ChunkPlacement]:
    """Chunk placements of a run, a tensor key, or the latest run's tensor of a node (given
    by what its keys start with, `ir.keys.key_base`); with `current`, only chunks still held
    (not released or lost)."""
    query = select(ChunkPlacement)
    if run_id is not None:
        query = query.where(ChunkPlacement.run_id == run_id)
    if tensor is not None:
        query = query.where(ChunkPlacement.tensor == tensor)
    if node_key is not None:
        with db.read() as session:
            latest = session.exec(
                select(ChunkPlacement.tensor)
                .where(col(ChunkPlacement.tensor).startswith(f"{node_key}@", autoescape=True))
                .order_by(col(ChunkPlacement.updated_at).desc()).limit(1)).first()
        if latest is None:
            return []
        query = query.where(ChunkPlacement.tensor == latest)
    if current:
        query = query.where(col(ChunkPlacement.state).in_(("memory", "spilled", "stored")))
    with db.read() as session:
        rows = list(session.exec(query))
    return sorted(rows, key=lambda p: (p.tensor, _chunk_order(p.chunk), p.worker))


def _chunk_order(chunk: str) -> tuple:
    return tuple(int(i) for i in chunk.split(",") if i)
