"""Writing runs, tasks, chunk placements and events: each call is one short transaction
(`finish_run` puts a run's last records and its outcome in one).

Task rows are appended in bulk. A chunk placement is one row per (run, tensor, chunk,
worker), updated in place as the chunk is spilled, released or lost, so the table says where
each chunk a run computed is now; a batch keeps only the last state of each row (PostgreSQL
refuses to update one row twice in one statement).
"""

from __future__ import annotations

import time

from sqlalchemy import insert, select, update

from deepx_flow.meta.db import Database
from deepx_flow.meta.models import ChunkPlacement, Device, GraphRecord, Run, Worker


def begin_run(db: Database, run: Run, graph_yaml: str, n_nodes: int) -> None:
    """Add the run (status running) and its graph, if this graph is new. Two processes may
    run a new graph at once, so the graph row is inserted with ON CONFLICT DO NOTHING."""
    with db.begin() as conn:
        graph = {"hash": run.graph_hash, "yaml": graph_yaml, "n_nodes": n_nodes,
                 "created_at": time.time()}
        if conn.dialect.name in ("sqlite", "postgresql"):
            mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
            conn.exec_driver_sql(
                f"INSERT INTO graphs (hash, yaml, n_nodes, created_at) VALUES "
                f"({mark}, {mark}, {mark}, {mark}) ON CONFLICT (hash) DO NOTHING",
                (graph["hash"], graph["yaml"], graph["n_nodes"], graph["created_at"]))
        elif conn.execute(select(GraphRecord.hash).where(
                GraphRecord.hash == run.graph_hash)).first() is None:
            conn.execute(insert(GraphRecord).values(**graph))
        conn.execute(insert(Run), run.model_dump())  # a constant statement: compiled once


def end_run(db: Database, run_id: str, status: str, error: str | None = None,
            ended_at: float | None = None) -> None:
    """Set the outcome of a run that is still running (a run is ended once), and its end
    (`ended_at`, default now)."""
    with db.begin() as conn:
        _end_run(conn, run_id, status, error, ended_at)


def _end_run(conn, run_id: str, status: str, error: str | None,
             ended_at: float | None = None) -> None:
    conn.execute(update(Run).where(Run.id == run_id, Run.status == "running")
                 .values(status=status, ended_at=ended_at or time.time(), error=error))


def finish_run(db: Database, run_id: str, status: str, error: str | None, batches: dict,
               also=None, ended_at: float | None = None) -> None:
    """`write_run_records(db, batches)`, then `end_run`, and `also(conn)` if given, all in
    one transaction: how a small run's driver ends it (each transaction also reads the
    schema version, and on SQLite waits for the write lock)."""
    with db.begin() as conn:
        _write_batches(conn, batches)
        _end_run(conn, run_id, status, error, ended_at)
        if also is not None:
            also(conn)


TASK_COLUMNS = ("key", "tensor", "operator", "worker", "start", "stop", "bytes_in",
                "bytes_out", "attempts", "status", "error", "comm_seconds")
PLACEMENT_COLUMNS = ("tensor", "chunk", "worker", "device", "tier", "nbytes", "state",
                     "updated_at")
EVENT_COLUMNS = ("at", "kind", "worker", "key", "message")


def write_records(db: Database, run_id: str, tasks: list[tuple], placements: list[tuple],
                  events: list[tuple]) -> None:
    """Append task and event rows and apply placement changes of one run, in one
    transaction (see `write_run_records`)."""
    write_run_records(db, {run_id: (tasks, placements, events)})


def write_run_records(db: Database, batches: dict) -> None:
    """For each run id in `batches`, (tasks, placements, events): append its task and event
    rows and apply its placement changes, all in one transaction. Rows are tuples in the
    order of TASK_COLUMNS, PLACEMENT_COLUMNS and EVENT_COLUMNS.

    This runs beside the scheduler (often in the same process), so it hands whole batches
    to the database driver's executemany instead of building ORM objects: about 10x less
    Python work per row."""
    if any(ts or ps or es for ts, ps, es in batches.values()):
        with db.begin() as conn:
            _write_batches(conn, batches)


def _write_batches(conn, batches: dict) -> None:
    tasks = [(run_id, *t) for run_id, (ts, _, _) in batches.items() for t in ts]
    events = [(run_id, *e) for run_id, (_, _, es) in batches.items() for e in es]
    latest = {}
    for run_id, (_, placements, _) in batches.items():
        for p in placements:  # in the order they happened: the last state of a row wins
            latest[(run_id, *p[:3])] = (run_id, *p)
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    if tasks:
        _insert_many(conn, "tasks", ("run_id",) + TASK_COLUMNS, mark, tasks)
    if events:
        _insert_many(conn, "events", ("run_id",) + EVENT_COLUMNS, mark, events)
        _mark_lost_devices(conn, [e[3] for e in events if e[2] == "device-lost"])
    if latest:
        _upsert_placements(conn, mark, list(latest.values()))


def _mark_lost_devices(conn, workers: list) -> None:
    """The registry's devices of workers whose device failed: unhealthy."""
    for worker in set(filter(None, workers)):
        conn.execute(update(Device).where(Device.worker_id.in_(
            select(Worker.id).where(Worker.address == worker))).values(healthy=False))


def _insert_many(conn, table: str, columns: tuple, mark: str, rows: list) -> None:
    conn.exec_driver_sql(f"INSERT INTO {table} ({', '.join(columns)}) "
                         f"VALUES ({', '.join([mark] * len(columns))})", rows)


def _upsert_placements(conn, mark: str, rows: list) -> None:
    """One row per (run, tensor, chunk, worker), updated in place. SQLite and PostgreSQL share
    the ON CONFLICT syntax; released and lost changes carry no size, so the size recorded
    before is kept."""
    columns = ("run_id",) + PLACEMENT_COLUMNS
    unique = ("run_id", "tensor", "chunk", "worker")
    if conn.dialect.name not in ("sqlite", "postgresql"):
        for row in rows:
            values = dict(zip(columns, row))
            where = [getattr(ChunkPlacement, c) == values[c] for c in unique]
            if not conn.execute(update(ChunkPlacement).where(*where).values(**values)).rowcount:
                conn.execute(insert(ChunkPlacement).values(**values))
        return
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns
                        if c not in unique and c != "nbytes")
    conn.exec_driver_sql(
        f"INSERT INTO chunk_placements ({', '.join(columns)}) "
        f"VALUES ({', '.join([mark] * len(columns))}) "
        f"ON CONFLICT ({', '.join(unique)}) DO UPDATE SET {updates}, "
        f"nbytes = COALESCE(excluded.nbytes, chunk_placements.nbytes)", rows)
