"""What the metadata database knows, as the contract's catalog answers it: runs so far
(assets and the registry next). The same rows `deepx-flow runs` and the dashboard read."""

from __future__ import annotations

from deepx_flow.errors import InputError, shown
from deepx_flow.gateway.errors import NotFound
from deepx_flow.runtime.run_history import STATUSES

MAX_RUNS = 1000


def run_answer(run) -> dict:
    """A `meta.models.Run` row as the contract's Run."""
    return {"id": run.id, "status": run.status, "kind": run.kind,
            "graph_hash": run.graph_hash, "started_at": run.started_at,
            "ended_at": run.ended_at or 0.0, "error": run.error or "", "tasks": run.n_tasks,
            "workers": run.n_workers, "cluster": run.cluster}


def list_runs(db, status: str | None = None, limit: int | None = None) -> dict:
    """The newest runs first, at most `limit` (default 20, at most MAX_RUNS), of one
    `status` when given."""
    from deepx_flow.meta.queries import list_runs as newest
    if status and status not in STATUSES:
        raise InputError(f"status {shown(status)} is not one of {', '.join(STATUSES)}")
    if limit is None or limit == 0:
        limit = 20
    if type(limit) is not int or not 0 < limit <= MAX_RUNS:
        raise InputError(f"limit {shown(limit)} is not a whole number from 1 to {MAX_RUNS}")
    return {"runs": [run_answer(r) for r in newest(db, limit=limit, status=status or None)]}


def get_run(db, run_id: str) -> dict:
    """One run by its id or a prefix of it that names one run; NotFound otherwise."""
    from deepx_flow.meta.queries import find_run
    if not isinstance(run_id, str) or not run_id:
        raise NotFound(f"no run {shown(run_id)}")
    try:
        return run_answer(find_run(db, run_id))
    except InputError as err:  # said without the database's URL, which clients need not see
        if "ambiguous" in str(err):
            raise InputError(f"run id {run_id!r} is ambiguous; give more of it") from None
        raise NotFound(f"no run {run_id!r}") from None


def registry(db, scheduler: str) -> dict:
    """The registry of the gateway's cluster (the scheduler at `scheduler`): its workers
    (running ones first) with their GPUs, the links measured between them, and the storage
    tiers they registered, as the metadata database holds them."""
    from sqlmodel import select

    from deepx_flow.meta.models import Device, Link, StorageTier, Worker
    with db.read() as session:
        workers = session.exec(select(Worker).where(Worker.scheduler == scheduler)
                               .order_by(Worker.status.desc(), Worker.address)).all()
        ids = [w.id for w in workers]
        devices = session.exec(select(Device).where(Device.worker_id.in_(ids))).all() \
            if ids else []
        tiers = session.exec(select(StorageTier).where(StorageTier.worker_id.in_(ids))).all() \
            if ids else []
        links = session.exec(select(Link).where(Link.scheduler == scheduler)
                             .order_by(Link.source, Link.target)).all()
    gpus: dict[int, list[str]] = {}
    for d in devices:
        gpus.setdefault(d.worker_id, []).append(d.name)
    return {"workers": [{"address": w.address, "host": w.host, "threads": w.nthreads,
                         "memory_bytes": w.memory_limit or 0,
                         "devices": gpus.get(w.id, []), "status": w.status}
                        for w in workers],
            "links": [{"source": k.source, "target": k.target, "protocol": k.protocol,
                       "bandwidth_bytes_per_second": k.bandwidth,
                       "latency_seconds": k.latency} for k in links],
            "storage_tiers": sorted({f"{t.tier}:{t.location}" for t in tiers})}
