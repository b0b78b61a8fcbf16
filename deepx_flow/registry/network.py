"""Network registration: protocol, bandwidth and latency between every pair of workers.

`probe_network` measures each ordered pair (a, b) of workers, one pair at a time so that
transfers do not compete with each other:

- latency: b pings a over Dask's worker-to-worker comm (the connection pool transfers use);
  half the median round trip of a few pings, after one that opens the connection;
- bandwidth: a task on a makes `nbytes` random bytes (random, so that a compressing comm
  cannot shrink them) and a task on b takes them as its argument, so b fetches them from a
  as it would any task's input. The fetch's duration is what Dask itself measured, from
  b's `transfer_incoming_log` (request sent to data deserialised; Dask rounds it up to at
  least 1 ms). Bandwidth is `nbytes` over the median duration of three such transfers.

The protocol is the scheme of the workers' addresses (tcp, ucx, inproc). Measurements are
stored in the `links` table (one row per scheduler, source and target, replaced by a newer
measurement). The probe starts no new pair after `timeout` seconds and warns how many it
left unmeasured; payloads are released after each pair.

`measured_links` turns stored rows into the `LinkSpec`s the compiler reads: per scope
("host": both workers on one host, "cluster": on different hosts), the median bandwidth and
latency of the measured pairs.
"""

from __future__ import annotations

import statistics
import time
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass

from sqlmodel import select

from deepx_flow.errors import ClusterError
from deepx_flow.registry.cluster import LinkSpec

DEFAULT_NBYTES = 32 * 2**20
PINGS = 5
TRANSFERS = 3


@dataclass(frozen=True)
class LinkMeasurement:
    """One measured ordered pair: data moved from `source` to `target`."""

    source: str
    target: str
    protocol: str
    bandwidth: float  # bytes/s
    latency: float  # seconds, one way
    nbytes: int  # size of the payload the bandwidth was measured with


def protocol_of(address: str) -> str:
    """The comm protocol of a Dask address: "tcp://10.0.0.1:8786" -> "tcp"."""
    scheme, sep, _ = address.partition("://")
    return scheme if sep else "tcp"


def probe_network(client, db=None, nbytes: int = DEFAULT_NBYTES,
                  timeout: float = 120.0) -> list[LinkMeasurement]:
    """Measure every ordered pair of the client's workers; store them in `db` if given.

    Returns the measurements (none with fewer than two workers).
    """
    from deepx_flow.registry.live import scheduler_workers
    workers = sorted(scheduler_workers(client))
    n = len(workers)
    # Round k pairs each worker with the k-th after it: if time runs out, what was measured
    # still covers every worker, not only the first few as sources.
    pairs = [(workers[i], workers[(i + k) % n]) for k in range(1, n) for i in range(n)]
    deadline = time.monotonic() + timeout
    results = []
    for a, b in pairs:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            results.append(measure_pair(client, a, b, nbytes, left))
        except TimeoutError:
            break
    if len(results) < len(pairs):
        warnings.warn(f"network probe stopped after {timeout:g} s: measured {len(results)} "
                      f"of {len(pairs)} worker pairs (give it more time, or a smaller "
                      f"payload)", RuntimeWarning, stacklevel=2)
    if db is not None and results:
        store_links(db, str(client.scheduler.address), results)
    return results


def measure_pair(client, source: str, target: str, nbytes: int = DEFAULT_NBYTES,
                 timeout: float = 60.0) -> LinkMeasurement:
    """Latency and bandwidth of moving data from worker `source` to worker `target`."""
    deadline = time.monotonic() + timeout
    round_trip = client.run(_ping, source, PINGS, workers=[target])[target]
    # The median of a few transfers: the first on a fresh connection is often slower.
    durations = [_transfer(client, source, target, nbytes, deadline - time.monotonic())
                 for _ in range(TRANSFERS)]
    return LinkMeasurement(source, target, protocol_of(target),
                           nbytes / statistics.median(durations), round_trip / 2, nbytes)


def _transfer(client, source: str, target: str, nbytes: int, timeout: float) -> float:
    """Seconds `target` took to fetch `nbytes` made on `source`, as Dask measured it."""
    if timeout <= 0:
        raise TimeoutError
    key = f"deepx-probe-{uuid.uuid4().hex}"
    payload = client.submit(_payload, nbytes, key=key, workers=[source],
                            allow_other_workers=False, pure=False)
    received = client.submit(_size, payload, key=key + "-received", workers=[target],
                             allow_other_workers=False, pure=False)
    try:
        received.result(timeout=timeout)
        fetches = client.run(_fetches, key, workers=[target])[target]
    finally:
        client.cancel([received, payload])
    fetch = next((f for f in fetches if f["who"] == source), None)
    if fetch is None:
        raise ClusterError(f"network probe: worker {target} has no record of fetching the "
                           f"probe payload from {source}")
    return fetch["duration"]


def _payload(nbytes: int):
    import numpy as np
    return np.frombuffer(np.random.default_rng().bytes(nbytes), dtype=np.uint8)


def _size(x) -> int:
    return int(x.nbytes)


async def _ping(peer: str, repeat: int, dask_worker=None) -> float:
    """On a worker: the median seconds of a ping to `peer` and its reply."""
    await dask_worker.rpc(peer).ping()  # opens the pooled connection the timed pings reuse
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await dask_worker.rpc(peer).ping()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _fetches(key: str, dask_worker=None) -> list[dict]:
    """On a worker: the fetches of `key` in its transfer log (who sent it, how long)."""
    return [{"who": e["who"], "duration": e["duration"], "total": e["total"]}
            for e in list(dask_worker.transfer_incoming_log) if key in e["keys"]]


def store_links(db, scheduler: str, measurements: list[LinkMeasurement]) -> None:
    """Upsert one `links` row per (scheduler, source, target)."""
    from deepx_flow.meta.models import Link
    now = time.time()
    with db.session() as session:
        for m in measurements:
            row = session.exec(select(Link).where(Link.scheduler == scheduler,
                                                  Link.source == m.source,
                                                  Link.target == m.target)).first()
            if row is None:
                row = Link(scheduler=scheduler, source=m.source, target=m.target,
                           protocol=m.protocol, bandwidth=m.bandwidth, latency=m.latency,
                           measured_at=now)
            else:
                row.protocol, row.bandwidth, row.latency = m.protocol, m.bandwidth, m.latency
                row.measured_at = now
            session.add(row)


def measured_links(db, scheduler: str, hosts: dict[str, str]) -> tuple[LinkSpec, ...]:
    """LinkSpecs (scope host, then cluster) from the stored measurements between the
    workers in `hosts` (address -> host); a scope with no measured pair is left out, so
    the compiler falls back to its default for it."""
    from deepx_flow.meta.models import Link
    with db.read() as session:  # a read: it must not queue behind writers (it runs per run)
        rows = session.exec(select(Link).where(Link.scheduler == scheduler)).all()
    scopes: dict[str, list] = {"host": [], "cluster": []}
    for row in rows:
        if row.source in hosts and row.target in hosts:
            same = hosts[row.source] == hosts[row.target]
            scopes["host" if same else "cluster"].append(row)
    return tuple(
        LinkSpec(scope, Counter(r.protocol for r in found).most_common(1)[0][0],
                 statistics.median(r.bandwidth for r in found),
                 statistics.median(r.latency for r in found))
        for scope, found in scopes.items() if found)
