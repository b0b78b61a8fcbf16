"""Network registration: a real probe between two worker processes over loopback TCP."""

import logging
import statistics
import time

import pytest
from distributed import Client, LocalCluster
from sqlmodel import select

from deepx_flow.meta.models import Link
from deepx_flow.registry.cluster import LinkSpec
from deepx_flow.registry.network import probe_network
from deepx_flow.registry.register import register_cluster

NBYTES = 4 * 2**20


@pytest.fixture(scope="module")
def tcp_client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      protocol="tcp", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def _links(db):
    with db.session() as session:
        return session.exec(select(Link)).all()


def test_probe_measures_every_ordered_pair(tcp_client, sqlite_db):
    workers = sorted(tcp_client.scheduler_info(n_workers=-1)["workers"])
    found = probe_network(tcp_client, sqlite_db, nbytes=NBYTES)
    assert sorted((m.source, m.target) for m in found) == \
        [(workers[0], workers[1]), (workers[1], workers[0])]
    for m in found:
        assert m.protocol == "tcp" and m.nbytes == NBYTES
        # Loopback between two processes: well above 10 MB/s and below 1 TB/s; a round trip
        # between 1 microsecond and half a second.
        assert 1e7 < m.bandwidth < 1e12, m
        assert 1e-6 < m.latency < 0.5, m
    rows = {(r.source, r.target): r for r in _links(sqlite_db)}
    assert set(rows) == {(m.source, m.target) for m in found}
    assert all(r.scheduler == tcp_client.scheduler.address for r in rows.values())
    assert {k: (r.bandwidth, r.latency) for k, r in rows.items()} == \
        {(m.source, m.target): (m.bandwidth, m.latency) for m in found}

    # Payloads are released: no probe key stays on the cluster.
    deadline = time.monotonic() + 10
    while any("deepx-probe" in str(k) for keys in tcp_client.has_what().values()
              for k in keys):
        assert time.monotonic() < deadline, tcp_client.has_what()
        time.sleep(0.05)

    # The compiler's spec takes the measured figures (both workers are on one host).
    spec = register_cluster(tcp_client, sqlite_db)
    assert spec.links == (LinkSpec("host", "tcp", statistics.median(m.bandwidth for m in found),
                                   statistics.median(m.latency for m in found)),)

    # Probing again replaces the rows instead of adding more.
    again = probe_network(tcp_client, sqlite_db, nbytes=NBYTES)
    assert len(_links(sqlite_db)) == 2
    assert {(r.source, r.target): r.bandwidth for r in _links(sqlite_db)} == \
        {(m.source, m.target): m.bandwidth for m in again}


def test_probe_is_bounded_in_time(tcp_client, sqlite_db):
    with pytest.warns(RuntimeWarning, match="measured 0 of 2 worker pairs"):
        assert probe_network(tcp_client, sqlite_db, nbytes=NBYTES, timeout=0) == []
    assert _links(sqlite_db) == []
