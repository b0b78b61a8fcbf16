"""Operator speeds measured on each worker: the registry's record of how fast each operator
went, as tasks run it (alone, fused, with an epilogue: the task's operator label).

The cost model's per-element figures are guesses (a random source's were 20-30 times too
fast on a 2-core machine), and a wrong guess misleads everything that waits on an expected
time. So when a run finishes, its finished tasks are summed per operator label and worker
(`SpeedSamples`): the cost model's FLOPs and bytes of each task, and the seconds it computed.
Each (operator, host, worker name) row keeps decayed sums, older runs counting `DECAY` as
much at each update, so a speed follows the machine as it is now.

The cost model uses a worker's measured speed where there is one (`OperatorSpeed.seconds`;
`runtime/recovery.expected_seconds`, which sets when a slow task gets a backup), and
`deepx-flow ops` lists them. Workers are known by host and name: an embedded cluster names
its workers 0, 1, ...; give `dask worker` / `dask cuda worker` processes stable names
(`--name`) for their speeds to carry over between cluster restarts. A worker without rows of
its own takes its host's.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import dataclass

from sqlmodel import select

from deepx_flow.meta.models import OperatorSpeed as SpeedRow

DECAY = 0.5  # weight of what earlier runs measured, at each update
MIN_SECONDS = 1e-3  # tasks quicker than this measure the timer, not the operator


@dataclass(frozen=True)
class OperatorSpeed:
    """One operator's measured speed on one worker."""

    flops_per_s: float
    bytes_per_s: float
    tasks: int

    def seconds(self, flops: float, moved: float) -> float:
        """Expected seconds of a task with the cost model's `flops` and bytes `moved`:
        scaled by FLOPs where the operator computes, else by bytes."""
        if flops > 0 and self.flops_per_s > 0:
            return flops / self.flops_per_s
        return moved / self.bytes_per_s if self.bytes_per_s > 0 else 0.0


class SpeedSamples:
    """Finished tasks of one run, summed per (operator label, worker address)."""

    def __init__(self, costs: dict, workers: dict):
        self.costs = costs  # node id -> (label, FLOPs per task, bytes per task)
        self.workers = workers  # worker address -> (host, name)
        self.sums: dict = defaultdict(lambda: [0.0, 0.0, 0.0, 0])

    @classmethod
    def of_plan(cls, plan, inlined: dict | None = None) -> "SpeedSamples":
        """The samples of a run of `plan`. A node whose tasks read sources inline (`inlined`:
        node id -> their ids, as `compiler.inline.inlined_nodes` gives) is measured under a
        label naming them ("sum <- read_zarr", `ir.program.speed_label`), so an operator's
        speed never mixes tasks with and without reads inside; its cost is its own and
        theirs (as `Plan.stats` counts it)."""
        from deepx_flow.ir.program import speed_label
        nodes = {n.id: n for n in plan.fused.nodes}
        costs = {s.node: (speed_label(nodes[s.node], [nodes[i] for i in
                                                      (inlined or {}).get(s.node, ())]),
                          s.flops / s.tasks, (s.bytes_in + s.bytes_out) / s.tasks)
                 for s in plan.stats().nodes if s.tasks and s.node in nodes}
        workers = {w.address: (w.host, w.name) for w in plan.cluster.workers if w.address}
        return cls(costs, workers)

    def add(self, node: str, worker: str | None, start, stop) -> None:
        """A task of `node` that finished on `worker`, computing from `start` to `stop`."""
        cost = self.costs.get(node)
        if cost is None or worker not in self.workers or start is None or stop is None \
                or stop - start < MIN_SECONDS:
            return
        label, flops, moved = cost
        entry = self.sums[label, worker]
        entry[0] += flops
        entry[1] += moved
        entry[2] += stop - start
        entry[3] += 1

    def record(self, db) -> None:
        """Fold the sums into the registry's rows (decaying what was there), each row one
        INSERT ... ON CONFLICT DO UPDATE whose update is arithmetic on the stored values, so
        drivers finishing runs at once neither collide on a new row nor lose each other's
        updates. Rows in (operator, host, worker) order: no two drivers wait in a circle."""
        if not self.sums:
            return
        with db.begin() as conn:
            self.record_on(conn)

    def record_on(self, conn) -> None:
        """`record` in the transaction of `conn` (a Core connection)."""
        if not self.sums:
            return
        now, rows = time.time(), []
        for (label, address), (flops, moved, seconds, tasks) in sorted(
                self.sums.items(), key=lambda item: (item[0][0], *self.workers[item[0][1]])):
            host, name = self.workers[address]
            rows.append(dict(operator=label, host=host, worker=name, flops=flops,
                             bytes=moved, seconds=seconds, tasks=tasks, updated_at=now))
        conn.execute(_upsert(conn.dialect.name), rows)  # executemany, in this order


@functools.cache
def _upsert(dialect: str):
    """The statement that folds one row of sums into the table (built once: SQLAlchemy's
    `excluded` columns are slow to make)."""
    table = SpeedRow.__table__
    new = _insert_for(dialect)(table)
    return new.on_conflict_do_update(
        index_elements=["operator", "host", "worker"],
        set_=dict(flops=table.c.flops * DECAY + new.excluded.flops,
                  bytes=table.c.bytes * DECAY + new.excluded.bytes,
                  seconds=table.c.seconds * DECAY + new.excluded.seconds,
                  tasks=table.c.tasks + new.excluded.tasks,
                  updated_at=new.excluded.updated_at))


def _insert_for(dialect: str):
    """The INSERT construct with ON CONFLICT of the database's dialect."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
        return insert
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
        return insert
    raise NotImplementedError(f"operator speeds need SQLite or PostgreSQL, not {dialect}")


def speed_of(row) -> OperatorSpeed:
    seconds = max(row.seconds, MIN_SECONDS)
    return OperatorSpeed(row.flops / seconds, row.bytes / seconds, row.tasks)


def worker_speeds(db, host: str, name: str) -> dict[str, OperatorSpeed]:
    """Operator label -> measured speed on the worker `name` of `host`; for operators it
    has no rows of, what the host's other workers measured (summed)."""
    with db.read() as session:
        rows = session.exec(select(SpeedRow).where(SpeedRow.host == host)).all()
    return _speeds_of(rows, name)


def _speeds_of(rows, name: str) -> dict[str, OperatorSpeed]:
    """`worker_speeds` from the rows of the worker's host."""
    own = {r.operator: speed_of(r) for r in rows if r.worker == name}
    pooled: dict = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        if r.operator not in own:
            entry = pooled[r.operator]
            entry[0] += r.flops
            entry[1] += r.bytes
            entry[2] += r.seconds
            entry[3] += r.tasks
    for label, (flops, moved, seconds, tasks) in pooled.items():
        own[label] = OperatorSpeed(flops / max(seconds, MIN_SECONDS),
                                   moved / max(seconds, MIN_SECONDS), tasks)
    return own


def with_speeds(spec, db):
    """`spec` (a ClusterSpec) with each worker's measured operator speeds (one read of the
    rows of all its hosts: this runs before every run)."""
    from dataclasses import replace
    hosts = sorted({w.host for w in spec.workers})
    with db.read() as session:
        rows = session.exec(select(SpeedRow).where(SpeedRow.host.in_(hosts))).all()
    by_host: dict = defaultdict(list)
    for r in rows:
        by_host[r.host].append(r)
    workers = tuple(replace(w, speeds=_speeds_of(by_host[w.host], w.name))
                    for w in spec.workers)
    return replace(spec, workers=workers)


@dataclass(frozen=True)
class MeasuredSpeed:
    """One row of the registry's measured speeds, as `deepx-flow ops` and the dashboard
    list them: an operator label on a worker, its tasks, its speed (FLOP/s is None for an
    operator that computes none, which is measured by bytes), and when it was updated."""

    operator: str
    host: str
    worker: str
    tasks: int
    flops_per_s: float | None
    bytes_per_s: float
    updated_at: float


def measured_speeds(db, limit: int | None = None) -> list[MeasuredSpeed]:
    """The measured speeds by operator label, host and worker (the first `limit`; all
    without one)."""
    query = select(SpeedRow).order_by(SpeedRow.operator, SpeedRow.host, SpeedRow.worker)
    with db.read() as session:
        rows = session.exec(query if limit is None else query.limit(limit)).all()
    out = []
    for r in rows:
        speed = speed_of(r)
        out.append(MeasuredSpeed(r.operator, r.host, r.worker, r.tasks,
                                 speed.flops_per_s if r.flops else None, speed.bytes_per_s,
                                 r.updated_at))
    return out


def speed_table(db) -> str | None:
    """The measured speeds for `deepx-flow ops` (None when nothing is measured yet)."""
    from deepx_flow.text_table import local_time, text_table
    rows = measured_speeds(db)
    if not rows:
        return None
    shown = [(r.operator, r.host, r.worker, r.tasks,
              "-" if r.flops_per_s is None else f"{r.flops_per_s / 1e9:.3g}",
              f"{r.bytes_per_s / 1e9:.3g}", local_time(r.updated_at)) for r in rows]
    return text_table(("operator", "host", "worker", "tasks", "GFLOP/s", "GB/s", "updated"),
                      shown, "Measured on this database's workers (from finished tasks)")


__all__ = ["OperatorSpeed", "SpeedSamples", "worker_speeds", "with_speeds", "speed_table",
           "MeasuredSpeed", "measured_speeds", "DECAY"]
