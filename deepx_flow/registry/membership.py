"""The spec of a live cluster, kept per Dask client while its workers stay the same.

Registering a cluster (`register.py`) asks every worker for a probe and writes their rows:
tens of milliseconds, which a loop of small runs (training steps, notebook cells) would pay
on every `dx.run` although nothing changed. So the spec is kept per client (and per
metadata database it was registered in), together with the scheduler's view of the workers
it was made from (`membership`: scheduler id, and each worker's address, process, name,
host, threads and memory limit), which one small round trip reads again for each run. Any
change there (a worker joined, left or was restarted, the client now talks to another
scheduler) probes and registers the cluster again.

The memory a worker process holds counts too, coarsely: the compiler's budget is the
worker's memory limit less what its process held when probed, so a worker process whose
memory (as its heartbeats tell the scheduler) moved by more than `MEMORY_TOLERANCE` of its
limit since then is probed again. (Threaded workers share the driver's process, which the
budget does not count, so their memory is not compared.)

A cluster registered here is held (`heartbeat.hold`): its workers are marked seen every few
seconds while the client runs, and gone when this process's own cluster closes.

What other processes may change in the database is not kept: measured links are read again
for each run here, and operator speeds by the caller (`speeds.with_speeds`).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, replace

from deepx_flow.registry.cluster import ClusterSpec

# Probe again when a worker process's memory moved by more than this fraction of its limit
# (the budget of each task moves by about as much, times the memory fraction).
MEMORY_TOLERANCE = 1 / 16


@dataclass(frozen=True)
class Membership:
    """The scheduler's view of its workers, as far as a plan depends on it."""

    scheduler: str  # the scheduler's id: a restarted scheduler is another cluster
    workers: tuple  # sorted (address, server id, name, host, threads, memory limit)
    memory: dict  # address -> bytes its process held at the last heartbeat (0: unknown)

    def same_workers(self, other: "Membership") -> bool:
        """Whether `other` shows the same worker processes, each holding about as much
        memory as here."""
        if (self.scheduler, self.workers) != (other.scheduler, other.workers):
            return False
        for address, *_, limit in self.workers:
            if limit and not address.startswith("inproc://") and abs(
                    self.memory.get(address, 0) - other.memory.get(address, 0)) \
                    > limit * MEMORY_TOLERANCE:
                return False
        return True


def membership(dask_scheduler) -> tuple:
    """Run on the scheduler: its id and its workers, the fields of a `Membership` (plain
    data, so the scheduler need not unpickle anything of ours to answer)."""
    workers, memory = [], {}
    for ws in dask_scheduler.workers.values():
        workers.append((ws.address, getattr(ws, "server_id", None), str(ws.name), ws.host,
                        ws.nthreads, ws.memory_limit))
        memory[ws.address] = int((ws.metrics or {}).get("memory") or 0)
    return dask_scheduler.id, tuple(sorted(workers)), memory


@dataclass
class _Known:
    db: object  # the Database it was registered in (None: not recorded)
    seen: Membership
    spec: ClusterSpec


_known: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # client -> _Known
_lock = threading.Lock()
registrations = 0  # probes of a whole cluster made here (the tests count them)


def live_spec(client, db=None) -> ClusterSpec:
    """The spec of the cluster behind `client`: registered in `db` (a Database) when given,
    with its measured links; kept while the workers stay the same (see the module
    docstring). A ClusterError when the cluster has no workers."""
    global registrations
    seen = Membership(*client.run_on_scheduler(membership))
    with _lock:
        known = _known.get(client)
    if known is not None and known.db is db and seen.workers and known.seen.same_workers(seen):
        if db is None:
            return known.spec
        from deepx_flow.registry.network import measured_links
        scheduler = str(client.scheduler.address)
        hosts = {w.address: w.host for w in known.spec.workers}
        return replace(known.spec, links=measured_links(db, scheduler, hosts))
    if db is None:
        from deepx_flow.registry.live import cluster_spec_from_client
        spec = cluster_spec_from_client(client)
    else:
        from deepx_flow.registry import heartbeat
        from deepx_flow.registry.register import register_cluster
        spec = register_cluster(client, db)
        heartbeat.hold(client, db)  # its workers stay seen while this process holds it
    with _lock:
        registrations += 1
        # Kept with what the scheduler showed before the probe: a worker that joined during
        # it makes the next run look again, never the other way round.
        _known[client] = _Known(db, seen, spec)
    return spec


def forget(client=None) -> None:
    """Drop the spec kept for `client` (default: for every client)."""
    with _lock:
        if client is None:
            _known.clear()
        else:
            _known.pop(client, None)


__all__ = ["live_spec", "membership", "Membership", "forget", "MEMORY_TOLERANCE"]
