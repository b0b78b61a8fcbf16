"""Memory and compute-storage registration of a real cluster in the metadata database."""

import logging
import time

from distributed import Client, LocalCluster
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.meta.models import Device, Link, Operator, StorageTier, Worker
from deepx_flow.ops import OPS
from deepx_flow.registry.cluster import LinkSpec
from deepx_flow.registry.live import probe_devices
from deepx_flow.registry.network import LinkMeasurement, measured_links, store_links
from deepx_flow.registry.operators import register_operators
from deepx_flow.registry.register import register_cluster


def _rows(db, model, *where):
    with db.session() as session:
        return session.exec(select(model).where(*where)).all()


def test_rows_match_the_scheduler(client, sqlite_db):
    spec = register_cluster(client, sqlite_db)
    scheduler = client.scheduler.address
    info = client.scheduler_info(n_workers=-1)["workers"]
    rows = {w.address: w for w in _rows(sqlite_db, Worker, Worker.scheduler == scheduler)}
    assert set(rows) == set(info) == {w.address for w in spec.workers}
    local_dirs = client.run(lambda dask_worker: dask_worker.local_directory)
    for address, w in info.items():
        row = rows[address]
        assert (row.name, row.host, row.nthreads, row.memory_limit) == \
            (str(w["name"]), w["host"], w["nthreads"], w["memory_limit"])
        assert row.protocol == "inproc" and row.status == "running"
        assert row.memory_reserved == 0  # threaded workers share this process
        tiers = {t.tier: t for t in _rows(sqlite_db, StorageTier, StorageTier.worker_id == row.id)}
        assert tiers["host"].capacity == w["memory_limit"] == 2**30
        assert tiers["disk"].location == local_dirs[address] and tiers["disk"].capacity > 0
        assert "object" not in tiers  # DEEPX_OBJECT_STORE is not set
        devices = _rows(sqlite_db, Device, Device.worker_id == row.id)
        assert [(d.name, d.memory_total) for d in devices] == \
            [(d["name"], d["total"]) for d in probe_devices()]  # none on a CPU machine
    assert spec.links == ()  # nothing measured yet: the compiler uses its defaults


def test_object_store_tier(client, sqlite_db, monkeypatch):
    # The probe reads the setting on the worker, which here is this process.
    monkeypatch.setenv("DEEPX_OBJECT_STORE", "s3://bucket/deepx")
    register_cluster(client, sqlite_db)
    tiers = _rows(sqlite_db, StorageTier, StorageTier.tier == "object")
    assert len(tiers) == 2 and {t.location for t in tiers} == {"s3://bucket/deepx"}
    assert all(t.capacity is None for t in tiers)


def test_gone_workers_are_marked_and_rows_not_duplicated(sqlite_db):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        register_cluster(client, sqlite_db)
        first = {w.address: w for w in _rows(sqlite_db, Worker)}
        n_tiers = len(_rows(sqlite_db, StorageTier))
        cluster.scale(1)
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) != 1:
            assert time.monotonic() < deadline, "the cluster did not scale down"
            time.sleep(0.05)
        spec = register_cluster(client, sqlite_db)
    rows = {w.address: w for w in _rows(sqlite_db, Worker)}
    assert set(rows) == set(first)  # the gone worker keeps its row
    (kept,) = [w.address for w in spec.workers]
    assert {a: w.status for a, w in rows.items()} == \
        {a: "running" if a == kept else "gone" for a in first}
    assert rows[kept].id == first[kept].id and rows[kept].first_seen == first[kept].first_seen
    assert rows[kept].last_seen > first[kept].last_seen
    assert len(_rows(sqlite_db, StorageTier)) == n_tiers  # replaced, not added again


def test_spec_takes_measured_links(client, sqlite_db):
    a, b = sorted(client.scheduler_info(n_workers=-1)["workers"])
    store_links(sqlite_db, client.scheduler.address,
                [LinkMeasurement(a, b, "inproc", 2e9, 1e-5, 1), LinkMeasurement(b, a, "inproc",
                                                                                4e9, 3e-5, 1)])
    spec = register_cluster(client, sqlite_db)
    assert spec.links == (LinkSpec("host", "inproc", 3e9, 2e-5),)
    assert spec.transfer_bandwidth == 3e9
    # The plan's communication estimate follows the measured bandwidth.
    x = dx.input("x", (4000, 3000), "float64")
    y = x @ dx.random.normal((3000, 2000), seed=0, dtype="float64")
    slow = dx.compile(y, cluster=spec).stats()
    store_links(sqlite_db, client.scheduler.address,
                [LinkMeasurement(a, b, "inproc", 6e9, 1e-5, 1), LinkMeasurement(b, a, "inproc",
                                                                                6e9, 3e-5, 1)])
    fast = dx.compile(y, cluster=register_cluster(client, sqlite_db)).stats()
    assert slow.comm_bytes > 0 and slow.comm_bytes == fast.comm_bytes
    assert abs(slow.comm_seconds / fast.comm_seconds - 2.0) < 1e-9


def test_links_by_scope(sqlite_db):
    """Pairs on one host make the 'host' link, pairs across hosts the 'cluster' link."""
    hosts = {"tcp://a:1": "h1", "tcp://a:2": "h1", "tcp://b:1": "h2"}
    pairs = [("tcp://a:1", "tcp://a:2", 10e9), ("tcp://a:2", "tcp://a:1", 12e9),
             ("tcp://a:1", "tcp://b:1", 1e9), ("tcp://b:1", "tcp://a:1", 3e9),
             ("tcp://b:1", "tcp://gone:1", 99e9)]  # not one of these workers: ignored
    store_links(sqlite_db, "tcp://s:8786",
                [LinkMeasurement(s, t, "tcp", bw, 1e-4, 1) for s, t, bw in pairs])
    store_links(sqlite_db, "tcp://other:8786",
                [LinkMeasurement("tcp://a:1", "tcp://b:1", "ucx", 50e9, 1e-6, 1)])
    assert measured_links(sqlite_db, "tcp://s:8786", hosts) == (
        LinkSpec("host", "tcp", 11e9, 1e-4), LinkSpec("cluster", "tcp", 2e9, 1e-4))
    assert len(_rows(sqlite_db, Link)) == 6


def test_registration_on_each_backend(client, db):
    """The upserts are plain ORM statements: the same on SQLite and PostgreSQL (`db` is the
    shared fixture that runs on both)."""
    a, b = sorted(client.scheduler_info(n_workers=-1)["workers"])
    for _ in range(2):  # the second round updates what the first inserted
        register_cluster(client, db)
        store_links(db, client.scheduler.address, [LinkMeasurement(a, b, "inproc", 1e9, 1e-5, 1)])
        register_operators(db)
    assert len(_rows(db, Worker)) == 2 and len(_rows(db, Link)) == 1
    assert len(_rows(db, StorageTier)) == 4 and len(_rows(db, Operator)) == len(OPS)
    assert register_cluster(client, db).links == (LinkSpec("host", "inproc", 1e9, 1e-5),)


DRIVERS = 8


def test_drivers_registering_one_cluster_at_once(client, db):
    """Drivers that plan for the same cluster at the same moment each register it: every one
    succeeds (no unique-key race on workers), and the registry holds each worker once, with
    its storage tiers once (`db` runs this on SQLite and PostgreSQL)."""
    import threading

    start = threading.Barrier(DRIVERS)
    specs, errors = [], []

    def driver():
        start.wait()
        try:
            specs.append(register_cluster(client, db))
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=driver) for _ in range(DRIVERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    info = client.scheduler_info(n_workers=-1)["workers"]
    rows = _rows(db, Worker)
    assert sorted(w.address for w in rows) == sorted(info)
    assert all(w.status == "running" for w in rows)
    tiers = [(t.worker_id, t.tier) for t in _rows(db, StorageTier)]
    assert sorted(tiers) == sorted((w.id, tier) for w in rows for tier in ("host", "disk"))
    assert len(specs) == DRIVERS and len(set(specs)) == 1
