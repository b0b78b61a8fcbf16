"""Registering a running cluster in the metadata database.

`register_cluster(client, db)` probes every worker (`live.probe_cluster`: threads, memory
limit, the memory its process holds, its GPU with total and free memory, its storage tiers)
and records them per scheduler: one `workers` row per address (updated when seen again,
keeping `first_seen`), its `devices` and `storage_tiers` rows replaced by what it reports
now, and workers of that scheduler that no longer answer marked `gone`.

Several drivers may plan for one cluster at the same moment, so a worker's row is an upsert
(INSERT ... ON CONFLICT DO UPDATE on its (scheduler, address)): whoever comes second updates
the row the first inserted instead of failing on the unique key. The upsert locks the row
until the transaction ends, so the drivers also take turns replacing that worker's devices
and tiers (each worker once, however many register it); rows are written in address order,
so two drivers never wait on each other's locks in a circle.

It returns the `ClusterSpec` the compiler plans with: the same workers as
`live.cluster_spec_from_client`, with links from the measured rows of the `links` table
(`deepx-flow registry probe`) when there are any between these workers, so the plan's
communication estimate uses measured bandwidth.
"""

from __future__ import annotations

import time

from sqlmodel import delete, select, update

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
        for address, (info, probe) in sorted(probed.items()):
            _record_worker(session, scheduler, specs[address], info, probe, now)
        session.exec(update(Worker).where(Worker.scheduler == scheduler,
                                          Worker.status != "gone",
                                          Worker.address.not_in(sorted(probed)))
                     .values(status="gone"))
    links = measured_links(db, scheduler, {a: w.host for a, w in specs.items()})
    return ClusterSpec(f"dask {scheduler}", tuple(specs.values()), links,
                       f"scheduler {scheduler}")


def _record_worker(session, scheduler: str, spec, info: dict, probe: dict,
                   now: float) -> None:
    values = dict(scheduler=scheduler, address=spec.address, name=spec.name, host=spec.host,
                  protocol=protocol_of(spec.address), nthreads=spec.threads,
                  memory_limit=int(info.get("memory_limit") or 0) or None,  # None: no limit
                  memory_reserved=spec.reserved, status="running", first_seen=now,
                  last_seen=now)
    worker_id = _upsert_worker(session.connection(), values)
    # Devices and tiers are what the worker reports now, not an accumulation; a device a
    # task lost (a CUDA error that breaks it) stays unhealthy while its worker lives.
    unhealthy = set(session.exec(select(Device.index).where(
        Device.worker_id == worker_id, Device.healthy.is_(False))).all())
    session.exec(delete(Device).where(Device.worker_id == worker_id))
    session.exec(delete(StorageTier).where(StorageTier.worker_id == worker_id))
    for dev in probe.get("devices", []):
        session.add(Device(worker_id=worker_id, index=dev.get("index", 0), kind="gpu",
                           name=dev["name"], memory_total=dev["total"],
                           memory_free=dev.get("free"), memory_usable=dev.get("usable"),
                           healthy=dev.get("index", 0) not in unhealthy, registered_at=now))
    for tier in probe.get("tiers", []):
        session.add(StorageTier(worker_id=worker_id, tier=tier["tier"],
                                location=tier["location"], capacity=tier["capacity"],
                                registered_at=now))
    session.flush()


def _upsert_worker(conn, values: dict) -> int:
    """Insert the worker's row, or update the one its (scheduler, address) has (keeping its
    first_seen); return its id."""
    table = Worker.__table__
    dialect = conn.dialect.name
    if dialect in ("postgresql", "sqlite"):
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        statement = insert(table).values(**values)
        changed = {c: statement.excluded[c] for c in values
                   if c not in ("scheduler", "address", "first_seen")}
        return conn.execute(statement.on_conflict_do_update(
            index_elements=["scheduler", "address"], set_=changed)
            .returning(table.c.id)).scalar_one()
    # Other databases: no portable upsert; two drivers registering at once may collide.
    where = (table.c.scheduler == values["scheduler"], table.c.address == values["address"])
    found = conn.execute(select(table.c.id).where(*where)).scalar()
    if found is None:
        return conn.execute(table.insert().values(**values)).inserted_primary_key[0]
    conn.execute(table.update().where(*where).values(
        **{c: v for c, v in values.items() if c != "first_seen"}))
    return found


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
