"""Registering a running cluster in the metadata database.

`register_cluster(client, db)` probes every worker (`live.probe_cluster`: threads, memory
limit, the memory its process holds, its GPU with total and free memory, its storage tiers)
and records them per scheduler: one `workers` row per address (updated when seen again,
keeping `first_seen`), its `devices` and `storage_tiers` rows replaced by what it reports
now, and workers of that scheduler that no longer answer marked `gone`.

It returns the `ClusterSpec` the compiler plans with: the same workers as
`live.cluster_spec_from_client`, with links from the measured rows of the `links` table
(`deepx-flow registry probe`) when there are any between these workers, so the plan's
communication estimate uses measured bandwidth.
"""

from __future__ import annotations

import time

from sqlmodel import delete, select

from deepx_flow.meta.models import Device, StorageTier, Worker
from deepx_flow.registry.cluster import ClusterSpec
from deepx_flow.registry.live import probe_cluster, worker_spec
from deepx_flow.registry.network import measured_links, protocol_of


def register_cluster(client, db=None, wait: float = 30.0) -> ClusterSpec:
    """Probe the workers behind `client`, record them in `db` (default: `open_db()`) and
    return the cluster's spec with measured links."""
    if db is None:
        from deepx_flow.meta import open_db
        db = open_db()
    scheduler = str(client.scheduler.address)
    probed = probe_cluster(client, wait)
    specs = {address: worker_spec(address, info, probe)
             for address, (info, probe) in probed.items()}
    now = time.time()
    with db.session() as session:
        for address, (info, probe) in probed.items():
            _record_worker(session, scheduler, specs[address], info, probe, now)
        running = session.exec(select(Worker).where(Worker.scheduler == scheduler,
                                                    Worker.status != "gone")).all()
        for row in running:
            if row.address not in probed:
                row.status = "gone"
                session.add(row)
    links = measured_links(db, scheduler, {a: w.host for a, w in specs.items()})
    return ClusterSpec(f"dask {scheduler}", tuple(specs.values()), links,
                       f"scheduler {scheduler}")


def _record_worker(session, scheduler: str, spec, info: dict, probe: dict,
                   now: float) -> None:
    row = session.exec(select(Worker).where(Worker.scheduler == scheduler,
                                            Worker.address == spec.address)).first()
    if row is None:
        row = Worker(scheduler=scheduler, address=spec.address, first_seen=now,
                     name="", host="", protocol="", nthreads=0, last_seen=now)
    row.name, row.host, row.protocol = spec.name, spec.host, protocol_of(spec.address)
    row.nthreads, row.memory_reserved = spec.threads, spec.reserved
    row.memory_limit = int(info.get("memory_limit") or 0) or None  # None: no limit set
    row.status, row.last_seen = "running", now
    session.add(row)
    session.flush()  # gives a new row its id
    # Devices and tiers are what the worker reports now, not an accumulation; a device a
    # task lost (a CUDA error that breaks it) stays unhealthy while its worker lives.
    unhealthy = set(session.exec(select(Device.index).where(
        Device.worker_id == row.id, Device.healthy.is_(False))).all())
    session.exec(delete(Device).where(Device.worker_id == row.id))
    session.exec(delete(StorageTier).where(StorageTier.worker_id == row.id))
    for dev in probe.get("devices", []):
        session.add(Device(worker_id=row.id, index=dev.get("index", 0), kind="gpu",
                           name=dev["name"], memory_total=dev["total"],
                           memory_free=dev.get("free"),
                           healthy=dev.get("index", 0) not in unhealthy, registered_at=now))
    for tier in probe.get("tiers", []):
        session.add(StorageTier(worker_id=row.id, tier=tier["tier"],
                                location=tier["location"], capacity=tier["capacity"],
                                registered_at=now))


def mark_gone(db, scheduler: str) -> int:
    """Mark the workers registered under `scheduler` gone (a cluster that was closed);
    returns how many were still marked running."""
    with db.session() as session:
        rows = session.exec(select(Worker).where(Worker.scheduler == scheduler,
                                                 Worker.status != "gone")).all()
        for row in rows:
            row.status = "gone"
            session.add(row)
    return len(rows)
