"""Compiling, running and persisting a graph: the execution scheduler's front door.

`dx.compile`, `dx.run` and `dx.persist` (`sdk/run.py`) collect the graph behind tensors and
the data they carry, and call these, which take a `Graph` and its inputs (so the runtime
needs nothing of the SDK). `run_graph` compiles the graph for the cluster it will run on,
binds the inputs, lowers the plan to one Dask graph, submits it, shows progress on long
runs, and gathers the outputs into NumPy arrays chunk by chunk. `persist_graph` leaves the
outputs on the cluster instead. Failures in tasks come back as ExecutionError naming the
task.

A loop of small runs (training steps, notebook cells) is not paid for in overhead: the plan
of a graph is kept for its next run on the same cluster with the same settings
(`plan_cache.py`), a live cluster is probed and registered once while its workers stay the
same (`registry/membership.py`), and the scheduler hears of a run in one round trip
(`begin.py`). What changes from run to run (input data, measured links and operator speeds)
is read every time.
"""

from __future__ import annotations

import logging
import math
import uuid
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import dask
import numpy as np

from deepx_flow.compiler.infer import infer_types
from deepx_flow.compiler.inline import inlined_nodes
from deepx_flow.compiler.validate import validate_graph
from deepx_flow.compiler.plan import Plan
from deepx_flow.errors import (ClusterError, DeepxError, ExecutionError, InputError, PlanError,
                               shown)
from deepx_flow.ir import Graph
from deepx_flow.ir.keys import key_name
from deepx_flow.ops.common import flag
from deepx_flow.registry.cluster import ClusterSpec, load_cluster_file, local_cluster_spec
from deepx_flow.config import settings
from deepx_flow.runtime.cancel import Cancellation
from deepx_flow.runtime.cluster import chosen_address, connect, current_client, shared_client
from deepx_flow.runtime.failures import task_failure
from deepx_flow.runtime.futures import blamed_key, quiet_interrupted_gathers
from deepx_flow.runtime.inputs import bind_inputs, check_sources_on, checked_inputs
from deepx_flow.runtime.phases import Completion, cluster_then_gather, phase
from deepx_flow.runtime.plan_cache import cached_compile
from deepx_flow.runtime.progress import RunProgress, checked_progress
from deepx_flow.runtime.recovery import ByKey, ByNode, Recovery, task_policies

if TYPE_CHECKING:
    from deepx_flow.runtime.recording import RunRecorder

log = logging.getLogger(__name__)
quiet_interrupted_gathers()

# Gather at most this many bytes of output chunks per round trip.
GATHER_BATCH_BYTES = 256 * 2**20


def cluster_spec(cluster=None, client=None) -> ClusterSpec:
    """The registry's view of the cluster to plan for.

    `cluster` may be a ClusterSpec or a cluster-file path; else the given client's cluster,
    else the current default Dask client's, else this machine's embedded cluster. A live
    cluster is registered in the metadata database (unless DEEPX_RECORD=0), links measured
    by `deepx-flow registry probe` replace the default link figures, and each worker gets
    the operator speeds recorded for it (`registry/speeds.py`). A live cluster's workers are
    probed and registered once while they stay the same (`registry/membership.py`); links
    and speeds are read for each call.
    """
    from deepx_flow.registry.membership import live_spec
    if isinstance(cluster, ClusterSpec):
        return cluster
    if cluster is not None:
        return load_cluster_file(cluster)
    client = client or current_client()
    if client is None:
        return local_cluster_spec()
    if settings().record:  # register the workers, and plan with the links measured for them
        from deepx_flow.meta import open_db
        from deepx_flow.registry.speeds import with_speeds
        try:
            db = open_db()
            return with_speeds(live_spec(client, db), db)
        except DeepxError as err:
            if isinstance(err, ClusterError):
                raise
            log.warning("deepx_flow: the cluster is not registered (planning without "
                        "measured links): %s", err)
    return live_spec(client)


def compile_graph(graph: Graph, cluster=None, client=None, replan: bool = False) -> Plan:
    """Compile `graph` into a chunked plan for a cluster (`dx.compile` of a graph: its
    parameters are described there)."""
    replan = flag(replan, "replan")
    chosen_address(client)
    return cached_compile(graph, cluster_spec(cluster, client), replan=replan)


@dataclass
class Persisted:
    """An output left on the cluster: its chunk futures, shape, dtype and chunks."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[tuple[int, ...], ...]
    futures: list
    client: object
    key: str  # the tensor key of the chunks: (key, *chunk index)
    recorder: RunRecorder | None = None  # records the run that made it, and its release

    def wait(self) -> "Persisted":
        """Block until every chunk is computed."""
        from distributed import wait
        with self.client.as_current():  # wait() uses the current client, which may not be it
            wait(self.futures)
        if self.recorder is not None:
            self.recorder.finish_if_done()
        return self

    def to_numpy(self) -> np.ndarray:
        """Gather the chunks into one NumPy array (refused, with a PlanError, when it would
        not fit in this process's memory: see `to_zarr`)."""
        check_gatherable({self.name: (self.shape, self.dtype)}, "gather")
        out = _gather(self.client, self.futures, self.shape, self.dtype, self.chunks)
        if self.recorder is not None:  # recorded now: the client may close right after
            self.recorder.finish_if_done()
        return out

    def to_zarr(self, uri) -> dict:
        """Write the chunks to a new Zarr v3 array at `uri` (a path or an fsspec URL where
        nothing exists yet), each chunk by the worker that holds it; the data never passes
        through this process. Returns what was written (`uri`, `shape`, `dtype`, `chunks`,
        `nbytes`, `stored_bytes`, `seconds`); read it back with `dx.read_zarr`."""
        from deepx_flow.storage.zarr_store import write_persisted
        return write_persisted(self, uri)

    def where(self) -> dict:
        """Where the chunks are now, from the scheduler: worker address -> (chunks, bytes),
        and under "pending" / "erred" the chunks not (or never to be) computed."""
        from collections import Counter
        states = Counter(f.status for f in self.futures)
        finished = [f for f in self.futures if f.status == "finished"]
        done = [f.key for f in finished]
        holders = self.client.who_has(finished) if done else {}  # it takes futures
        sizes = self.client.nbytes(done, summary=False) if done else {}  # and this, keys
        out: dict = {}
        for key in done:
            for worker in holders.get(key, ()):
                chunks, nbytes = out.get(worker, (0, 0))
                out[worker] = (chunks + 1, nbytes + sizes.get(key, 0))
        for state in ("pending", "error", "lost", "cancelled"):
            if states[state]:
                out["erred" if state == "error" else state] = (states[state], 0)
        return out

    def __repr__(self) -> str:
        if not self.futures:
            return f"<Persisted '{self.name}' {self.shape} {self.dtype}: released>"
        finished = sum(f.status == "finished" for f in self.futures)
        return (f"<Persisted '{self.name}' {self.shape} {self.dtype}: {finished} of "
                f"{len(self.futures)} chunks computed; dx.placement(p) says where>")

    def _repr_html_(self) -> str:
        from deepx_flow.registry.cluster import format_bytes
        from deepx_flow.text_table import html_facts, html_table
        facts = [("shape", self.shape), ("dtype", self.dtype),
                 ("chunks", " x ".join(str(len(c)) for c in self.chunks) or "1"),
                 ("tensor key", self.key)]
        if self.recorder is not None:
            facts.append(("run", self.recorder.run_id))
        head = html_facts(f"dx.Persisted '{self.name}'", facts)
        if not self.futures:
            return head + "<p>released: the cluster no longer holds it</p>"
        rows = [(where, chunks, format_bytes(nbytes) if nbytes else "-")
                for where, (chunks, nbytes) in sorted(self.where().items())]
        return head + html_table(("worker", "chunks", "bytes"), rows)

    def release(self) -> None:
        """Let the cluster drop the chunks (the placement table then says "released")."""
        keys = [f.key for f in self.futures if self.client.refcount.get(f.key, 0) <= 1]
        for future in self.futures:
            future.release()
        self.futures = []
        if self.recorder is not None:
            self.recorder.flush_quietly(settle_keys=keys)


def driver_memory() -> int:
    """The bytes this process could still take: the machine's available memory, within the
    container's limit where there is one."""
    import psutil
    from distributed.system import MEMORY_LIMIT
    return min(psutil.virtual_memory().available, MEMORY_LIMIT)


def check_gatherable(outputs: dict, verb: str = "run", available: int | None = None) -> None:
    """Refuse, before any work, to gather outputs that cannot fit in this process.

    `outputs` maps names to (shape, dtype). Gathering holds every output whole plus one
    batch of chunks in flight (`GATHER_BATCH_BYTES`); more than the memory available now
    would end with the kernel killing this process (a notebook's kernel dies with no
    message), so it is a PlanError that says what to do instead. `available`: the bytes to
    compare with (default: `driver_memory()` now)."""
    from deepx_flow.ir.dtypes import itemsize
    sizes = {name: math.prod(shape) * itemsize(str(dtype))
             for name, (shape, dtype) in outputs.items()}
    total = sum(sizes.values())
    available = driver_memory() if available is None else available
    if total + min(total, GATHER_BATCH_BYTES) <= available:
        return
    from deepx_flow.registry.cluster import format_bytes
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"'{n}' of shape {tuple(outputs[n][0])} {outputs[n][1]}: "
                      f"{format_bytes(b)}" for n, b in largest)
    raise PlanError(
        f"dx.{verb} would gather {format_bytes(total)} of outputs into this process "
        f"({named}{', ...' if len(sizes) > 3 else ''}), but only {format_bytes(available)} "
        "of memory is available here. Keep the result on the cluster with dx.persist(...) "
        "and write it out with .to_zarr(path), store it as an asset (dx.asset), or run a "
        "smaller result (a slice or a reduction) instead.")


def checked(graph: Graph, inputs: dict | None) -> tuple[Graph, dict]:
    """`graph` validated and typed, and its bound inputs (name -> array, path, persisted
    output or `Binding`): every mistake in the graph or the inputs is reported before a
    cluster is started or contacted."""
    if not isinstance(graph, Graph):
        raise InputError(f"a run takes a Graph here, not {type(graph).__name__} "
                         f"(tensors are run by dx.run)")
    graph = infer_types(validate_graph(graph))
    return graph, bind_inputs(graph, checked_inputs(inputs))


def _submit(plan: Plan, graph: Graph, sources, client, kind: str, hold=None, extend=None,
            db=None, recovery: Recovery | None = None, owners=None, readable=None,
            lowered=None, placement: dict | None = None, progress: RunProgress | None = None,
            explain: str | None = None):
    """Lower and submit the plan.

    `hold` names the outputs whose chunk futures to return (default: all). `extend(lowered)`
    may add tasks to the lowered graph (writes to storage, checks) and returns the keys of
    those to compute as well. The run is recorded in `db` (a Database; default the
    configured one), and supervised with `recovery` (`owners`: node id -> the Recovery of
    the asset it computes). `readable(lowered)` may say which chunks `extend`'s tasks store
    (chunk key -> `readback.Stored`), to read back if lost. Returns output futures by name,
    output tensor keys by name, the run's recorder (None when recording is off) and the
    futures of `extend`'s keys. `lowered` is the plan already lowered (several training
    steps of one plan, chained: `train.loop`), in place of lowering it with `sources`.
    `placement` maps keys to the worker that should run them (loosely: Dask may run them
    elsewhere if that worker is gone), for work spread on purpose (data-parallel shards).
    `progress` is told the run's id and size as it is submitted. `explain` is the plan's
    text to record, where it says more than `plan.explain()`.
    """
    check_sources_on(sources, client)
    with phase("lower"):
        if lowered is None:
            lowered = plan.lower(sources, to_host=plan.cluster.has_devices)
        held = [name for name, _ in graph.outputs if hold is None or name in hold]
        keys = {name: lowered.output_keys(name) for name in held}
        extra = list(extend(lowered)) if extend is not None else []
        flat = [k for ks in keys.values() for k in ks] + extra
        inlined = inlined_nodes(lowered.dsk, plan.fused, plan.chained)
    # Imported here: recording needs the database's modules, which planning alone (explain)
    # does not.
    from deepx_flow.runtime.recording import RunRecorder
    with phase("record"):
        recorder = RunRecorder.start(plan, lowered, client, inlined, kind, db, explain)
    try:
        with phase("submit"):
            recovery = recovery or Recovery()
            policies = task_policies(plan, recovery, owners, inlined)
            stored = readable(lowered) if readable is not None and recovery.read_back else None
            run_id = recorder.run_id if recorder else uuid.uuid4().hex
            supervise(client, run_id, lowered.dsk, policies, recovery, stored,
                      recorder.tracking if recorder else None)
            if progress is not None:
                progress.attach(client, run_id, len(lowered.dsk), recorder is not None)
            spread = dict(workers=ByKey(placement, sorted(set(placement.values()))),
                          allow_other_workers=True) if placement else {}
            with warnings.catch_warnings(), dask.annotate(
                    retries=ByNode({n: p.retries for n, p in policies.items()}, 0),
                    deepx_backoff=ByNode({n: (p.backoff, p.backoff_max) for n, p in
                                          policies.items()}), **spread):
                # NumPy inputs travel inside the graph on purpose (so they can be sent again if
                # a worker dies); Dask's advice against large graphs does not apply.
                warnings.filterwarnings("ignore", message="Sending large graph")
                futures = client.get(_named_graph(lowered.dsk), flat, sync=False)
    except BaseException as err:
        if recorder is not None:
            recorder.fail(err)
        raise
    by_key = dict(zip(flat, futures))
    names = {name: lowered.outputs[name][0] for name in keys}
    return ({name: [by_key[k] for k in ks] for name, ks in keys.items()}, names, recorder,
            [by_key[k] for k in extra])


def _named_graph(dsk):
    """The Dask graph as `Client.get` takes it, named by a random token. Given a plain dict,
    Dask names it by hashing every task, the NumPy inputs inside included (27 ms for a 32
    MiB input, on every run), although its keys are content addresses already
    (`compiler/lower.py`); Dask names its own high-level graphs by a random token too."""
    try:
        from dask._expr import LLGExpr
        return LLGExpr(dsk, _determ_token=uuid.uuid4().hex)
    except (ImportError, TypeError):  # a Dask without graph expressions: it takes the dict
        return dsk


def supervise(client, run_id: str, dsk, policies, recovery: Recovery, readable=None,
              tracking: dict | None = None) -> None:
    """Have the scheduler's supervisor (installed once per cluster) watch the run's tasks:
    timeouts and drift, excluded workers, lost devices, stored chunks to read back if lost
    (`runtime/supervisor.py`); with `tracking` (a recorder's), have its recorder plugin
    track them too, in the same round trip (`runtime/begin.py`)."""
    from deepx_flow.runtime.begin import begin_run
    watch = dict(run_id=run_id, policies=policies, exclude_after=recovery.exclude_after,
                 worker_wait=recovery.worker_wait, readable=readable)
    begin_run(client, {key_name(k) for k in dsk}, watch, tracking)


def run_graph(graph: Graph, inputs: dict | None = None, client=None,
              scheduler: str | None = None, cluster=None,
              progress: bool | RunProgress | None = None, recovery: Recovery | None = None,
              replan: bool = False, cancel: Cancellation | None = None) -> dict:
    """Compute the outputs of `graph` and return them as NumPy arrays by output name
    (`dx.run` of a graph: its parameters are described there)."""
    if cancel is not None and not isinstance(cancel, Cancellation):
        raise InputError(f"cancel is {shown(cancel)}, not a dx.Cancellation")
    with phase("check"):
        graph, bound = checked(graph, inputs)
        fresh = flag(replan, "replan")
        check_gatherable({name: (graph[node].shape, graph[node].dtype)
                          for name, node in dict(graph.outputs).items()})
    recovery, progress = Recovery.of(recovery), RunProgress.of(checked_progress(progress))
    chosen_address(client, scheduler)  # the arguments as given: `client or ...` below
    planned = cluster_spec(cluster) if cluster is not None else None
    # Persisted inputs pick their own cluster unless one was named (then it must be theirs).
    with connect(client or (None if scheduler else _persisted_client(inputs)),
                 scheduler) as active:
        with phase("connect"):
            spec = planned or cluster_spec(None, active)
        config = settings()
        replanned = None
        for attempt in range(recovery.replan_on_oom + 1):
            with phase("plan"):
                plan = cached_compile(graph, spec, config, replan=fresh and attempt == 0)
            try:
                results = _compute(plan, graph, bound, active, progress, recovery, replanned,
                                   cancel=cancel)
                break
            except ExecutionError as err:
                if err.kind != "oom" or attempt == recovery.replan_on_oom:
                    raise
                # Smaller chunks: plan again with half the memory budget per task.
                config = replace(config, memory_fraction=config.memory_fraction / 2)
                replanned = (f"planned again with memory fraction {config.memory_fraction:g} "
                             f"(smaller chunks) after: {err}")
                log.warning("deepx_flow: %s", replanned)
    return results


def _compute(plan, graph, bound, client, progress, recovery=None, note=None,
             kind: str = "run", db=None, cancel: Cancellation | None = None) -> dict:
    """Run the plan and gather every output (by name); its run, recorded as `kind` in `db`
    (default the configured database), ends with the call; `cancel` may stop it."""
    progress = RunProgress.of(progress)
    futures, _, recorder, _ = _submit(plan, graph, bound, client, kind, recovery=recovery,
                                      progress=progress, db=db)
    flat = [f for fs in futures.values() for f in fs]
    completion = Completion.of(flat)
    if recorder is not None:
        with phase("record"):
            if note:
                recorder.note("replan", note)
            recorder.watch()
    if cancel is not None:
        cancel.watch(client, flat)
    try:
        out = {}
        with progress, cluster_then_gather(completion):
            for name, node_id in graph.outputs:
                node = plan.graph[node_id]
                out[name] = _gather(client, futures[name], node.shape, node.dtype,
                                    plan.partition.chunks[node_id], plan)
    except BaseException as err:
        # Release the failed run's keys now: the error's traceback keeps these futures
        # alive (a notebook keeps the last one), and a key left erred on the scheduler
        # would fail the same computation run again at once.
        for f in flat:
            f.release()
        if cancel is not None and cancel.cancelled:  # its futures were cancelled: say so
            cancelled = cancel.error(recorder.run_id if recorder is not None else None)
            if recorder is not None:
                recorder.fail(cancelled)
            raise cancelled from None
        if recorder is not None:
            recorder.fail(err)
        raise
    finally:
        if cancel is not None:
            cancel.forget(flat)
    if recorder is not None:
        with phase("finish"):
            # The outputs are NumPy arrays now; dropping the futures frees the chunks, and
            # the placement table should say so (for keys no other handle here still holds).
            keys = [f.key for f in flat if client.refcount.get(f.key, 0) <= 1]
            for f in flat:
                f.release()
            recorder.finish(settle_keys=keys)
    return out


def _gather(client, futures, shape, dtype, chunks, plan=None) -> np.ndarray:
    """The output of `futures` (its chunks in C order over the grid `chunks`) as one array,
    each chunk fetched as soon as it is done: the transfer of the first overlaps the
    computing of the rest, where waiting for all of them left a 64 MiB output's transfer
    (50-90 ms here) after the cluster's last task. At most GATHER_BATCH_BYTES of chunks are
    held besides the output."""
    import itertools

    from distributed import as_completed
    out = np.empty(shape, dtype=dtype)
    starts = [tuple(itertools.accumulate((0,) + c[:-1])) for c in chunks]
    slots: dict = {}  # key -> the output's slices it fills
    unique = []
    for f, idx in zip(futures, itertools.product(*(range(len(c)) for c in chunks))):
        if f.key not in slots:
            slots[f.key] = []
            unique.append(f)
        slots[f.key].append(tuple(slice(s[i], s[i] + c[i])
                                  for s, c, i in zip(starts, chunks, idx)))
    per_chunk = max(1, math.prod(max(c) for c in chunks) * out.itemsize)
    batch = max(1, GATHER_BATCH_BYTES // per_chunk)
    if getattr(client, "status", "running") != "running":
        # as_completed would wait on a closed client's loop for ever; gather says so
        return _assembled(out, slots, unique, _gathered(client, unique, plan))
    for done in as_completed(unique, loop=client.loop).batches():
        for at in range(0, len(done), batch):
            part = done[at:at + batch]
            _assembled(out, slots, part, _gathered(client, part, plan))
    return out


def _assembled(out, slots: dict, futures, values):
    """`out` with each of `values` written into the slots of its future's key."""
    for f, value in zip(futures, values):
        for slot in slots[f.key]:
            out[slot] = value
    return out


def _gathered(client, part, plan) -> list:
    """The values of the futures `part` (finished), or the error that names what failed."""
    try:
        return client.gather(part)
    except Exception as err:
        # Bad input a task found (a file it cannot read) names itself; anything else, a
        # kernel's own ExecutionError (a CodegenError) included, is named by its task and
        # keeps its kind.
        if isinstance(err, DeepxError) and not isinstance(err, ExecutionError):
            raise
        failed = next((f.key for f in part if f.status == "error"), None)
        if failed is None:
            if isinstance(err, DeepxError):
                raise
            raise ExecutionError(f"a task failed: {type(err).__name__}: {err}") from err
        raise task_failure(plan, blamed_key(client, failed), err) from err


def _persisted_client(inputs):
    """The client holding any persisted input: a run that reads it must use that cluster."""
    for value in (inputs or {}).values():
        if isinstance(value, Persisted):
            return value.client
    return None


def lasting_client(client=None, scheduler: str | None = None, inputs=None):
    """The client for work whose results outlive the call (persisted handles, stored
    assets): the one given, else one for `scheduler` (or DEEPX_SCHEDULER), else the cluster
    holding a persisted input, the process's default client, or the shared embedded one."""
    address = chosen_address(client, scheduler)
    return (client or (shared_client(address) if address else None)
            or _persisted_client(inputs) or current_client() or shared_client())


def persist_graph(graph: Graph, inputs: dict | None = None, client=None,
                  scheduler: str | None = None, cluster=None, recovery: Recovery | None = None,
                  replan: bool = False) -> dict[str, "Persisted"]:
    """Compute the outputs of `graph` and keep them on the cluster: a `Persisted` handle
    by output name (`dx.persist` of a graph)."""
    graph, bound = checked(graph, inputs)
    replan = flag(replan, "replan")
    recovery = Recovery.of(recovery)
    planned = cluster_spec(cluster) if cluster is not None else None
    active = lasting_client(client, scheduler, inputs)
    plan = cached_compile(graph, planned or cluster_spec(None, active), replan=replan)
    futures, keys, recorder, _ = _submit(plan, graph, bound, active, "persist",
                                         recovery=recovery)
    if recorder is not None:
        recorder.watch([f for fs in futures.values() for f in fs])
    handles = {}
    for name, node_id in graph.outputs:
        node = plan.graph[node_id]
        handles[name] = Persisted(name, node.shape, node.dtype, plan.partition.chunks[node_id],
                                  futures[name], active, keys[name], recorder)
    return handles


__all__ = ["compile_graph", "run_graph", "persist_graph", "Persisted", "cluster_spec", "checked",
           "Recovery"]
