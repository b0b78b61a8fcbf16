"""A run's compiled plan, rebuilt from what the metadata database holds of it.

The `graphs` row keeps the graph as YAML. It is parsed with a safe YAML loader (plain data
only: no Python object can be built from the database's text) and read by the spec reader
(`document_to_graph`, what `dx.from_yaml` uses after its own `yaml.safe_load`), then
compiled as `dx.run` compiles (`compile_graph`: validate, infer, fuse, partition) for a
cluster like the run's: the workers its scheduler had registered when it started, with the
memory they registered. `from_yaml` itself is not called: it would read a file named by a
one-line string, and nothing the database holds may choose a file to read.

Chunk grids also depend on the DEEPX_* planning settings of this process, and a run that
ran out of memory was planned again with smaller chunks; the run's own plan text
(`runs.explain`) is the record of what ran, and `Rebuilt.chunks_differ` says when the
rebuilt grids do not add up to the chunks the run recorded.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import yaml
from sqlmodel import col, select

from deepx_flow.meta.models import Device, GraphRecord, Run, Worker
from deepx_flow.registry.cluster import ClusterSpec, DeviceSpec, WorkerSpec, local_cluster_spec

MAX_REBUILT_NODES = 5_000  # parsing and compiling more holds the page for seconds
# Graphs are stored by content hash, so a plan for (graph, cluster, settings) never changes:
# the last few are kept, and a second look at a big graph costs nothing.
CACHED_PLANS = 8
_plans: OrderedDict = OrderedDict()
_plans_lock = threading.Lock()
# libyaml's safe loader when PyYAML has it (several times faster on big graphs); both build
# plain dicts, lists, strings and numbers only.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Rebuilt:
    """The plan (None when it could not be rebuilt), what went wrong, and how the cluster
    it was planned for was found."""

    plan: object | None
    problem: str = ""
    cluster_note: str = ""
    chunks_differ: bool = False


def cluster_from_rows(name: str, workers, devices: dict) -> ClusterSpec:
    """The ClusterSpec of registered `workers` rows (`devices`: worker id -> its first
    device row), as `registry.live.worker_spec` made it when they registered. A worker
    registered without a memory limit is given this machine's memory, as there."""
    specs = []
    for w in workers:
        dev = devices.get(w.id)
        device = DeviceSpec(dev.kind, dev.name, int(dev.memory_total),
                            usable=dev.memory_usable) \
            if dev is not None and dev.memory_total else None
        memory = w.memory_limit or _host_memory()
        specs.append(WorkerSpec(w.name, w.host, max(1, w.nthreads), memory, device,
                                address=w.address, reserved=w.memory_reserved or 0))
    return ClusterSpec(name, tuple(specs), (), "registered workers")


def run_cluster(db, run: Run) -> tuple[ClusterSpec, str]:
    """A cluster like the one `run` was planned for, and a note saying where it came from:
    the `n_workers` workers of its scheduler registered before it started and seen last,
    or, when none were registered (recording planned for a cluster file, say), this
    machine's."""
    query = (select(Worker).where(Worker.scheduler == run.scheduler,
                                  Worker.first_seen <= run.started_at)
             .order_by(col(Worker.last_seen).desc(), col(Worker.id)).limit(max(1, run.n_workers)))
    with db.read() as session:
        workers = list(session.exec(query))
        ids = [w.id for w in workers]
        rows = session.exec(select(Device).where(col(Device.worker_id).in_(ids))
                            .order_by(col(Device.worker_id), col(Device.index))).all() \
            if ids else []
    if not workers:
        return local_cluster_spec(), (f"no workers of {run.scheduler} are registered, so "
                                      f"this is planned for this machine's cluster")
    devices: dict = {}
    for d in rows:
        devices.setdefault(d.worker_id, d)
    note = f"planned for {len(workers)} registered worker(s) of {run.scheduler}"
    if len(workers) != run.n_workers:
        note += f" (the run had {run.n_workers})"
    return cluster_from_rows(run.cluster, workers, devices), note


def parse_graph(text: str):
    """The typed, validated Graph a spec's YAML text describes (SpecError / GraphError
    when it is not one; yaml.YAMLError when it is not YAML)."""
    from deepx_flow.spec.reader import document_to_graph
    return document_to_graph(yaml.load(text, Loader=_SAFE_LOADER))  # noqa: S506 (safe)


def rebuild(db, run: Run, config=None) -> Rebuilt:
    """`run`'s plan compiled again from its recorded graph; never raises for bad content."""
    from deepx_flow.config import settings

    with db.read() as session:
        size = session.exec(select(GraphRecord.n_nodes)
                            .where(GraphRecord.hash == run.graph_hash)).first()
    if size is None:
        return Rebuilt(None, f"run {run.id}: its graph {run.graph_hash} is not in the "
                             f"graphs table")
    if size > MAX_REBUILT_NODES:
        return Rebuilt(None, f"run {run.id}: its graph {run.graph_hash} has {size:,} nodes; "
                             f"this page draws graphs of up to {MAX_REBUILT_NODES:,} (the "
                             f"run's plan is below)")
    try:
        cluster, note = run_cluster(db, run)
    except Exception as err:  # registered rows that make no cluster (no threads, say)
        return Rebuilt(None, f"run {run.id}: no cluster to plan its graph for: "
                             f"{type(err).__name__}: {err}")
    key = (run.graph_hash, cluster, config or settings())
    with _plans_lock:
        found = _plans.get(key)
    if found is None:
        found = _compile(db, run, key[1], key[2])
        with _plans_lock:
            _plans[key] = found
            while len(_plans) > CACHED_PLANS:
                _plans.popitem(last=False)
    plan, problem = found
    if plan is None:
        return Rebuilt(None, problem)
    chunks = sum(math.prod(len(c) for c in grid) for grid in plan.partition.chunks.values())
    return Rebuilt(plan, "", note, chunks != run.n_chunks)


def _compile(db, run: Run, cluster: ClusterSpec, config) -> tuple:
    """(the plan, "") or (None, what went wrong)."""
    from deepx_flow.compiler.compile import compile_graph

    with db.read() as session:
        text = session.exec(select(GraphRecord.yaml)
                            .where(GraphRecord.hash == run.graph_hash)).first()
    if not text:
        return None, f"run {run.id}: its graph {run.graph_hash} was recorded without its YAML"
    try:
        graph = parse_graph(text)
    except Exception as err:  # the database's text is untrusted input: say what is wrong
        return None, (f"run {run.id}: cannot read its graph {run.graph_hash}: "
                      f"{type(err).__name__}: {err}")
    try:
        return compile_graph(graph, cluster, config), ""
    except Exception as err:
        return None, (f"run {run.id}: compiling its graph {run.graph_hash} for cluster "
                      f"'{cluster.name}' failed: {type(err).__name__}: {err}")


def _host_memory() -> int:
    import psutil
    return psutil.virtual_memory().total
