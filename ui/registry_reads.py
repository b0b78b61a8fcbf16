"""What the registry page reads: the operators (the installed code's, as `deepx-flow ops`
lists them, and any others the database has registered) and their measured speeds, the
clusters (schedulers) on record (all, or the live ones: `live_since`, the heartbeat rule of
`registry/heartbeat.py`), one cluster's measured links and storage tiers with the bytes held
in each, and the chunk placements of one tensor.

Every read is bounded (LIMIT) or aggregated in SQL. Storage use is summed in the database
per worker and tier, over the chunks the scheduler's runs recorded as still held (in memory,
spilled or stored).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, and_, case, cast, func
from sqlmodel import col, select

from deepx_flow.meta.models import (ChunkPlacement, Link, Operator, OperatorSpeed, Run,
                                    StorageTier, Worker)
from deepx_flow.meta.queries import plain_rows

HELD = ("memory", "spilled", "stored")  # states whose bytes occupy a tier
SHOWN = HELD + ("lost",)  # states drawn in the chunk grid (released chunks are gone)
MAX_OPERATORS = 2_000
MAX_SPEEDS = 5_000  # measured speeds: an (operator label, worker) each
MAX_SCHEDULERS = 50
MAX_LINKS = 10_000  # about 100 workers: a matrix larger than that is not readable anyway
MAX_TIERS = 5_000  # a cluster's tiers: a few per worker
RECENT_RUNS = 1_000  # the tensor chooser lists tensors of the latest runs
MAX_TENSORS = 200
MAX_CELLS = 4_000  # cells drawn of one tensor (each is sent to the browser: 5,000 took 3 s)


OPERATOR_COLUMNS = ("name", "kind", "engines", "fusable", "flops/element",
                    "temp bytes/element", "source", "doc")


def operator_rows(registered, installed: set[str], recorded=()) -> list[dict]:
    """The operators as the page lists them (OPERATOR_COLUMNS): those of the installed code
    (`registered`: `registry.operators.registered_operators()`, what `deepx-flow ops` lists,
    with the engines of each this machine has, `installed`), then the rows `recorded` in
    the database (`Operator`) of operators this installation lacks (registered by another
    machine's, with an entry point not installed here), with no engine here. The database
    alone is not the list: a fresh project has registered nothing yet."""
    from deepx_flow.registry.operators import engines_here
    rows = [dict(zip(OPERATOR_COLUMNS, (
        r.spec.name, r.spec.kind, engines_here(r.spec, installed),
        str(r.spec.fusable).lower(), r.spec.flops_per_element,
        r.spec.temp_bytes_per_element, r.source, _first_line(r.spec.doc)))) for r in registered]
    here = {r.spec.name for r in registered}
    rows += [dict(zip(OPERATOR_COLUMNS, (
        o.name, o.kind, "none here", str(o.fusable).lower(), o.flops_per_element,
        o.temp_bytes_per_element, f"{o.source} (registered by another installation)",
        _first_line(o.doc)))) for o in recorded if o.name not in here]
    return rows


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n")[0]


def recorded_operators(db, limit: int = MAX_OPERATORS) -> list[Operator]:
    """The operators registered in the database, by name (the first `limit`)."""
    with db.read() as session:
        return list(session.exec(select(Operator).order_by(col(Operator.name)).limit(limit)))


def speed_rows(db, limit: int = MAX_SPEEDS) -> tuple[list[dict], int]:
    """The measured operator speeds (`registry.speeds.measured_speeds`, what `deepx-flow
    ops` lists under them) as rows of SPEED_COLUMNS (the first `limit`; GFLOP/s is "-" for
    an operator measured by bytes), and how many there are."""
    from deepx_flow.registry.speeds import measured_speeds
    rows = measured_speeds(db, limit)
    with db.read() as session:
        total = session.exec(select(func.count()).select_from(OperatorSpeed)).one()
    return [dict(zip(SPEED_COLUMNS, (
        r.operator, r.host, r.worker, r.tasks,
        "-" if r.flops_per_s is None else r.flops_per_s / 1e9, r.bytes_per_s / 1e9,
        r.updated_at))) for r in rows], int(total)


SPEED_COLUMNS = ("operator", "host", "worker", "tasks", "GFLOP/s", "GB/s", "updated")


@dataclass(frozen=True)
class Scheduler:
    """A cluster on record: its scheduler address, when its links were last measured and
    its workers last seen (None when never)."""

    address: str
    measured_at: float | None
    seen_at: float | None


def schedulers(db, limit: int = MAX_SCHEDULERS,
               live_since: float | None = None) -> list[Scheduler]:
    """The clusters with measured links or registered workers: the most recently measured
    first, then those never measured by when their workers were last seen. With
    `live_since`, only the live ones: with a worker running and seen since then."""
    seen = select(Worker.scheduler, func.max(Worker.last_seen)).group_by(Worker.scheduler)
    if live_since is not None:
        seen = seen.where(Worker.status == "running", col(Worker.last_seen) >= live_since)
    with db.read() as session:
        seen = dict(session.exec(seen.order_by(func.max(Worker.last_seen).desc())
                                 .limit(limit)).all())
        measured = select(Link.scheduler, func.max(Link.measured_at)).group_by(Link.scheduler)
        if live_since is not None:
            measured = measured.where(col(Link.scheduler).in_(list(seen)))
        measured = dict(session.exec(measured.order_by(func.max(Link.measured_at).desc())
                                     .limit(limit)).all())
    found = [Scheduler(a, measured.get(a), seen.get(a)) for a in set(measured) | set(seen)]
    found.sort(key=lambda s: (s.measured_at is None, -(s.measured_at or 0.0),
                              -(s.seen_at or 0.0), s.address))
    return found[:limit]


def links(db, scheduler: str, limit: int = MAX_LINKS) -> tuple[list, int]:
    """The measured links of `scheduler` (the first `limit` by source and target: rows with
    source, target, protocol, bandwidth, latency), and how many there are."""
    where = Link.scheduler == scheduler
    query = (select(Link.source, Link.target, Link.protocol, Link.bandwidth, Link.latency)
             .where(where).order_by(col(Link.source), col(Link.target)).limit(limit))
    with db.read() as session:
        conn = session.connection()  # plain rows: thousands of ORM objects cost a second
        rows = plain_rows(conn.execute(query))
        total = conn.execute(select(func.count()).select_from(Link).where(where)).scalar_one()
    return rows, int(total)


def storage_tiers(db, scheduler: str, limit: int = MAX_TIERS, live_since: float | None = None,
                  history: bool = True) -> tuple[list[dict], int]:
    """The storage tiers of `scheduler`'s workers (by worker address, fastest tier first;
    the first `limit`), each with the bytes and chunks it holds, and how many tiers there
    are. The bytes are summed in one aggregate over the placements of that scheduler's runs
    (a worker address can come back on another cluster, so the run says which it was).
    Without an index on the placements' state this reads them all once: about 0.3 s for
    200,000 rows.

    A worker's `status` is as recorded; with `live_since`, a running worker not seen since
    then is `gone` (the heartbeat rule), and without `history` only live workers' tiers
    are read."""
    held = (select(ChunkPlacement.worker, ChunkPlacement.tier,
                   cast(func.sum(func.coalesce(ChunkPlacement.nbytes, 0)),  # not NUMERIC
                        BigInteger).label("held"),
                   func.count().label("chunks"))
            .join(Run, col(Run.id) == col(ChunkPlacement.run_id))
            .where(Run.scheduler == scheduler, col(ChunkPlacement.state).in_(HELD))
            .group_by(ChunkPlacement.worker, ChunkPlacement.tier)
            .subquery("held"))
    status, where = col(Worker.status), [Worker.scheduler == scheduler]
    if live_since is not None:
        live = and_(Worker.status == "running", col(Worker.last_seen) >= live_since)
        status = case((live, "running"), else_="gone")
        if not history:
            where.append(live)
    # One worker has one device tier (a worker per GPU), so tier alone finds its bytes.
    query = (select(Worker.address, status.label("status"), StorageTier.tier,
                    StorageTier.location, StorageTier.capacity,
                    func.coalesce(held.c.held, 0).label("held"),
                    func.coalesce(held.c.chunks, 0).label("chunks"))
             .join(Worker, col(Worker.id) == col(StorageTier.worker_id))
             .outerjoin(held, and_(held.c.worker == Worker.address,
                                   held.c.tier == StorageTier.tier))
             .where(*where)
             .order_by(col(Worker.address), col(StorageTier.id)).limit(limit))
    count = (select(func.count()).select_from(StorageTier)
             .join(Worker, col(Worker.id) == col(StorageTier.worker_id))
             .where(*where))
    with db.read() as session:
        conn = session.connection()
        rows = [dict(r._mapping) for r in conn.execute(query)]
        total = conn.execute(count).scalar_one()
    return rows, int(total)


def used_percent(held: int, capacity: int | None) -> float | None:
    """The share of a tier's capacity its chunks hold (None when the capacity is unknown)."""
    return round(100.0 * held / capacity, 3) if capacity else None


def recent_tensors(db, limit: int = MAX_TENSORS,
                   runs: int = RECENT_RUNS) -> list[tuple[str, int]]:
    """The tensors of the latest `runs` runs with chunks shown in the grid (held or lost),
    the most recently placed first (the first `limit`), with their number of placements.
    Only the latest runs, so that the list costs the same with a million placements."""
    latest = select(Run.id).order_by(col(Run.started_at).desc()).limit(runs)
    at = func.max(ChunkPlacement.updated_at)
    query = (select(ChunkPlacement.tensor, func.count())
             .where(col(ChunkPlacement.run_id).in_(latest),
                    col(ChunkPlacement.state).in_(SHOWN))
             .group_by(ChunkPlacement.tensor).order_by(at.desc()).limit(limit))
    with db.read() as session:
        return [(t, int(n)) for t, n in session.exec(query).all()]


def tensor_placements(db, tensor: str, limit: int = MAX_CELLS) -> tuple[list, int]:
    """The placements of `tensor` that are held or lost (the first `limit`: rows with chunk,
    worker, device, tier, nbytes, state), and how many there are in all."""
    where = and_(ChunkPlacement.tensor == tensor, col(ChunkPlacement.state).in_(SHOWN))
    query = (select(ChunkPlacement.chunk, ChunkPlacement.worker, ChunkPlacement.device,
                    ChunkPlacement.tier, ChunkPlacement.nbytes, ChunkPlacement.state)
             .where(where).order_by(col(ChunkPlacement.id)).limit(limit))
    with db.read() as session:
        conn = session.connection()
        rows = plain_rows(conn.execute(query))
        total = conn.execute(select(func.count()).select_from(ChunkPlacement)
                             .where(where)).scalar_one()
    return rows, int(total)
