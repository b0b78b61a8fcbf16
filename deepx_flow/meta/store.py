"""Writing runs, tasks, chunk placements and events: each call is one short transaction.

Task rows are appended in bulk. A chunk placement is one row per (tensor, chunk, worker),
updated in place as the chunk is spilled, released or lost, so the table says where each
chunk is now; a batch keeps only the last state of each row (PostgreSQL refuses to update
one row twice in one statement).
"""

from __future__ import annotations

import time

from sqlalchemy import func, insert, update
from sqlalchemy.dialects import postgresql, sqlite

from deepx_flow.meta.db import Database
from deepx_flow.meta.models import ChunkPlacement, Event, GraphRecord, Run, Task


def begin_run(db: Database, run: Run, graph_yaml: str, n_nodes: int) -> None:
    """Add the run (status running) and its graph, if this graph is new."""
    with db.session() as session:
        if session.get(GraphRecord, run.graph_hash) is None:
            session.add(GraphRecord(hash=run.graph_hash, yaml=graph_yaml, n_nodes=n_nodes,
                                    created_at=time.time()))
            session.flush()
        session.add(run)


def end_run(db: Database, run_id: str, status: str, error: str | None = None) -> None:
    with db.begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id)
                     .values(status=status, ended_at=time.time(), error=error))


def write_records(db: Database, run_id: str, tasks: list[dict], placements: list[dict],
                  events: list[dict]) -> None:
    """Append task and event rows and apply placement changes, in one transaction."""
    if not (tasks or placements or events):
        return
    with db.begin() as conn:
        if tasks:
            conn.execute(insert(Task), [{"run_id": run_id, **t} for t in tasks])
        if events:
            conn.execute(insert(Event), [{"run_id": run_id, **e} for e in events])
        if placements:
            _upsert_placements(conn, run_id, placements)


def _upsert_placements(conn, run_id: str, placements: list[dict]) -> None:
    latest = {}
    for p in placements:  # in the order they happened: the last state of each row wins
        latest[(p["tensor"], p["chunk"], p["worker"])] = p
    rows = [{"run_id": run_id, "tensor": p["tensor"], "chunk": p["chunk"],
             "worker": p["worker"], "device": p.get("device"), "tier": p.get("tier", "host"),
             "nbytes": p.get("nbytes"), "state": p["state"], "updated_at": p["at"]}
            for p in latest.values()]
    dialect = {"sqlite": sqlite, "postgresql": postgresql}.get(conn.dialect.name)
    if dialect is None:  # other backends: update, then insert what was not there
        for row in rows:
            done = conn.execute(update(ChunkPlacement).where(
                ChunkPlacement.tensor == row["tensor"], ChunkPlacement.chunk == row["chunk"],
                ChunkPlacement.worker == row["worker"]).values(**row)).rowcount
            if not done:
                conn.execute(insert(ChunkPlacement).values(**row))
        return
    stmt = dialect.insert(ChunkPlacement)
    table = ChunkPlacement.__table__
    stmt = stmt.on_conflict_do_update(
        index_elements=["tensor", "chunk", "worker"],
        set_={"run_id": stmt.excluded.run_id, "state": stmt.excluded.state,
              "tier": stmt.excluded.tier, "device": stmt.excluded.device,
              "updated_at": stmt.excluded.updated_at,
              # released and lost events carry no size: keep the one recorded before
              "nbytes": func.coalesce(stmt.excluded.nbytes, table.c.nbytes)})
    conn.execute(stmt, rows)
