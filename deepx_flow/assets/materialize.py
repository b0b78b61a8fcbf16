"""Materializing assets: compose the selected bodies into one graph, compile and run it
once, store each asset (or partition) as a new version, run its checks, record it all.

One Dask graph per stage holds the assets' tasks, the tasks that write each chunk to
storage as soon as it is computed (so a tensor larger than the cluster's memory can be
stored), and the checks' reductions, which read the same chunks while they are in memory.
Stages come from blocking checks: whatever reads a checked asset runs in the next stage,
only if the check passed (`targets.stages`). Without blocking checks there is one stage.

Publishing is data first, row last: each version is written to a fresh location and its
database row, which makes it visible, is added only after every chunk was written (a
stage's rows in one transaction). A crash leaves the previous version readable; a failed
stage cancels its tasks and deletes what it wrote.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
import warnings
from dataclasses import dataclass, field

from deepx_flow.assets import catalog
from deepx_flow.assets.compose import compose
from deepx_flow.assets.gc import collect_before_writing
from deepx_flow.assets.root import asset_root
from deepx_flow.assets.selection import select as select_assets
from deepx_flow.assets.status import stale_targets
from deepx_flow.assets.targets import Target, reads, stages, targets_for
from deepx_flow.errors import CheckFailed, DataError, DeepxError, ExecutionError, GraphError
from deepx_flow.meta import open_db
from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization
from deepx_flow.runtime.cancel import RunCancelled
from deepx_flow.runtime.failures import task_failure
from deepx_flow.runtime.futures import (blamed_key, cancel_and_settle, error_of,
                                        why_not_finished)
from deepx_flow.runtime.run import Persisted
from deepx_flow.sdk.tensor import Tensor


@dataclass(frozen=True)
class Materialized:
    """What one `materialize` call stored: version rows by target ("asset" or
    "asset[partition]"), the runs that made them, and what was skipped and why."""

    versions: dict[str, AssetMaterialization]
    run_ids: list[str]
    seconds: float
    checks: dict[str, list[AssetCheckResult]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str | None:
        """The (first) run that made these versions."""
        return self.run_ids[0] if self.run_ids else None

    def __str__(self) -> str:
        from deepx_flow.assets.report import materialized_text
        return materialized_text(self)

    def _repr_html_(self) -> str:
        from deepx_flow.assets.report import materialized_html
        return materialized_html(self)


def materialize(defs, select="*", *, partitions=None, only_stale: bool = False, client=None,
                scheduler: str | None = None, db=None, recovery=None,
                progress=None, cancel=None) -> Materialized:
    """Materialize the assets `select` picks (see `deepx_flow.assets.selection`).

    Parameters
    ----------
    defs : Definitions
    select : str or list
        Asset selection: `"*"`, `"embeddings"`, `"+embeddings"`, `"features*"`, ...
    partitions : str or list, optional
        For partitioned assets: a key, a list of keys, or `"first...last"` (a backfill);
        default every partition.
    only_stale : bool
        Only what is stale (never made, code version changed, upstream newer), and what is
        downstream of it in the selection.
    client, scheduler
        The Dask cluster to use (default: the shared embedded one, as `dx.persist`).
    db : str, optional
        Metadata database URL (default DEEPX_DB_URL, else `.deepx/deepx.db`).
    recovery : dx.Recovery, optional
        Retries, timeouts and drift for the run (an asset's own `recovery=` wins for its
        tasks); see docs/recovery.md.
    progress : bool, optional
        Show each run's id, dashboard link and a progress bar once it has gone on for 2 s
        (default: when the session is interactive), as `dx.run` does.
    cancel : dx.Cancellation, optional
        A token whose `cancel()`, from another thread, stops the materialization: the
        stage under way is discarded (its runs recorded interrupted), the versions of
        stages before it stay, and `RunCancelled` is raised.

    Raises
    ------
    CheckFailed
        A blocking check failed; everything else was stored and recorded, and the error's
        `materialized` says what.
    """
    from deepx_flow.runtime.cluster import chosen_address
    from deepx_flow.runtime.progress import checked_progress
    from deepx_flow.errors import InputError, shown
    from deepx_flow.runtime.cancel import Cancellation
    from deepx_flow.runtime.recovery import Recovery
    from deepx_flow.runtime.run import lasting_client

    if cancel is not None and not isinstance(cancel, Cancellation):
        raise InputError(f"cancel is {shown(cancel)}, not a dx.Cancellation")
    recovery, progress = Recovery.of(recovery), checked_progress(progress)
    chosen_address(client, scheduler)
    database = open_db(db)
    now = dt.datetime.now(dt.timezone.utc)
    targets = targets_for(defs, select_assets(defs, select), partitions, now)
    if only_stale:
        targets = stale_targets(defs, targets, database, now)
    if not targets:
        return Materialized({}, [], 0.0)
    collect_before_writing(database, sorted({t.asset for t in targets}))
    began = time.perf_counter()
    active = lasting_client(client, scheduler)
    versions = {t: uuid.uuid4().hex for t in targets}
    written: dict[Target, AssetMaterialization] = {}
    checks: dict[Target, list[AssetCheckResult]] = {}
    skipped: dict[Target, str] = {}
    run_ids: list[str] = []
    for stage in stages(defs, targets, now):
        todo = []
        for t in stage:
            blocked = _blocked_by(defs, t, written, checks, skipped, now)
            if blocked:
                skipped[t] = blocked
            else:
                todo.append(t)
        if todo:
            if cancel is not None and cancel.cancelled:
                raise cancel.error(None)
            run_ids += _run_stage_mending(defs, todo, versions, written, checks, database,
                                          active, now, recovery, progress, cancel)
    result = Materialized({str(t): r for t, r in written.items()}, run_ids,
                          time.perf_counter() - began, {str(t): c for t, c in checks.items()},
                          {str(t): why for t, why in skipped.items()})
    _report_checks(result)
    return result


def _run_stage_mending(defs, stage, versions, written, checks, db, client, now,
                       recovery, progress=None, cancel=None) -> list[str]:
    """`_run_stage`; when it finds a stored upstream version missing or damaged, that
    upstream target is materialized again from its lineage (a new version, as materializing
    it would make), then the stage runs again with the event in its run's record. Each
    target is mended once per stage; the run ids of every run made, the mending included."""
    from deepx_flow.runtime.recovery import Recovery
    mend = (recovery or Recovery()).recompute_damaged
    run_ids, notes, mended = [], [], set()
    while True:
        try:
            run_id = _run_stage(defs, stage, versions, written, checks, db, client, now,
                                recovery, notes, progress, cancel)
            return run_ids + ([run_id] if run_id else [])
        except DataError as err:
            damaged = _damaged_target(defs, err, stage)
            if not mend or damaged is None or damaged in mended:
                raise
            mended.add(damaged)
            again = materialize(defs, damaged.asset,
                                partitions=None if damaged.partition is None
                                else [damaged.partition],
                                client=client, db=db.url, recovery=recovery,
                                progress=progress, cancel=cancel)
            row = again.versions[str(damaged)]
            if damaged in written:  # stored by an earlier stage of this materialization
                written[damaged] = row
            run_ids += again.run_ids
            notes.append(("recompute", f"{err}; {damaged} was computed again from its "
                                       f"lineage as version {row.version[:12]}"))
            for t in stage:  # new locations: a write of the failed attempt may still land
                versions[t] = uuid.uuid4().hex


def _damaged_target(defs, err: DataError, stage) -> Target | None:
    """The stored upstream target whose damaged version `err` is about, when its lineage is
    known (it is one of `defs`' assets) and it is not being made in `stage`."""
    if not err.asset or err.asset not in defs.order:
        return None
    target = Target(err.asset, err.partition)
    return None if target in stage else target


def _blocked_by(defs, t: Target, written, checks, skipped, now) -> str | None:
    """Why `t` must not run: an upstream target of this materialization failed a blocking
    check or was itself skipped."""
    for ups in reads(defs, t, now).values():
        for u in ups:
            if u in skipped:
                return f"upstream {u} was not materialized"
            failed = [c.check for c in checks.get(u, ()) if c.blocking and not c.passed]
            if u in written and failed:
                return f"blocking check {failed[0]} of {u} failed"
    return None


def _report_checks(result: Materialized) -> None:
    blocking = [(name, c) for name, cs in result.checks.items() for c in cs
                if not c.passed and c.blocking]
    for name, c in ((n, c) for n, cs in result.checks.items() for c in cs
                    if not c.passed and not c.blocking):
        warnings.warn(f"asset {name}: check {c.check} failed: {c.message}", stacklevel=3)
    if blocking:
        name, c = blocking[0]
        more = f" (and {len(blocking) - 1} more)" if len(blocking) > 1 else ""
        stopped = f"; not materialized: {', '.join(result.skipped)}" if result.skipped else ""
        raise CheckFailed(f"asset {name}: blocking check {c.check} failed: {c.message}{more}"
                          f"{stopped}", result)


# --- one stage: one graph, one run -------------------------------------------------------

def _run_stage(defs, stage: list[Target], versions, written, checks, db, client,
               now, recovery=None, notes=(), progress=None, cancel=None) -> str | None:
    """Compute, write and check the targets of one stage; record their versions. Returns
    the run id (None when recording is off). `notes` ((kind, message) pairs) go into the
    run's events; `progress` and `cancel` are `materialize`'s.

    Nothing of a failed stage stays: running tasks are cancelled, then every array it
    created is deleted, and no row is written. Its rows are published in one transaction.
    """
    from deepx_flow.runtime.plan_cache import cached_compile
    from deepx_flow.runtime.progress import RunProgress
    from deepx_flow.runtime.run import _submit, cluster_spec
    from deepx_flow.sdk.run import checked
    from deepx_flow.storage.engines import get_engine, streams

    began = time.perf_counter()
    tensors, used = compose(defs, stage, versions, written, db, now)
    outputs, measured = {}, {}
    for i, t in enumerate(stage):
        outputs[f"t{i}"] = tensors[t]
        for j, c in enumerate(defs[t.asset].checks):
            measured[t, j] = _check_outputs(t, c, tensors[t], f"t{i}_check{j}", outputs)
    graph, bound = checked(outputs)
    plan = cached_compile(graph, cluster_spec(None, client))
    engines = {t: get_engine(defs[t.asset].storage) for t in stage}
    out_name = {t: f"t{i}" for i, t in enumerate(stage)}
    out_id = dict(graph.outputs)
    nodes = {t: plan.graph[out_id[out_name[t]]] for t in stage}
    chunks = {t: plan.partition.chunks[out_id[out_name[t]]] for t in stage}
    streamed = [t for t in stage if streams(engines[t])]
    held = [out_name[t] for t in stage if t not in streamed] + \
        [name for names in measured.values() for name in names or ()]
    created: dict[Target, str] = {}  # what to delete if the stage fails
    labels = {f"store-{t.asset}-{versions[t][:12]}": f"store[{engines[t].name}]"
              for t in streamed}

    write_tasks: dict[Target, dict] = {}

    def add_writes(lowered) -> list:
        keys = []
        for t in streamed:
            tasks = write_tasks[t] = engines[t].write_tasks(
                created[t], lowered.outputs[out_name[t]][0], nodes[t].shape, nodes[t].dtype,
                chunks[t], f"store-{t.asset}-{versions[t][:12]}")
            lowered.dsk.update(tasks)
            keys += list(tasks)
        return keys

    def readable(lowered) -> dict:
        """Where each stored chunk can be read back from, should its worker be lost."""
        from deepx_flow.runtime.readback import stored_chunks
        out = {}
        for t in streamed:
            out.update(stored_chunks(lowered.outputs[out_name[t]][0], chunks[t],
                                     write_tasks[t], engines[t].reader_uri(created[t])))
        return out

    every, recorder = [], None
    progress = RunProgress.of(progress, label="materialize")
    try:
        for t in streamed:
            created[t] = engines[t].create(_uri(engines[t], t, versions[t]), nodes[t].shape,
                                           nodes[t].dtype, chunks[t])
        futures, keys, recorder, writes = _submit(
            plan, graph, bound, client, "materialize", hold=held, extend=add_writes, db=db,
            recovery=recovery, owners=_owners(plan, [(out_name[t], defs[t.asset].recovery)
                                                     for t in stage]), readable=readable,
            progress=progress)
        every = [f for fs in futures.values() for f in fs] + writes
        if recorder is not None:
            recorder.labels.update(labels)  # task rows say "store[zarr]" for the writes
            for kind, message in notes:
                recorder.note(kind, message)
            recorder.watch()
        if cancel is not None:
            cancel.watch(client, every)
        with progress:
            _wait_or_raise(client, every, plan)
        values = {k: _gather_scalars(client, futures, names, plan, graph)
                  for k, names in measured.items() if names is not None}
        infos = {}
        for t in stage:
            if t in streamed:
                infos[t] = engines[t].commit(created[t], nodes[t].shape, nodes[t].dtype,
                                             chunks[t], began)
            else:
                infos[t] = engines[t].write(
                    Persisted(str(t), nodes[t].shape, nodes[t].dtype, chunks[t],
                              list(futures[out_name[t]]), client, keys[out_name[t]]),
                    _uri(engines[t], t, versions[t]))
                created[t] = infos[t]["uri"]
        run_id = recorder.run_id if recorder is not None else None
        seconds = time.perf_counter() - began
        results = {t: [_verdict(c, values.get((t, j)), nodes[t])
                       for j, c in enumerate(defs[t.asset].checks)] for t in stage}
        rows = {t: _row(defs[t.asset], t, versions[t], used[t], nodes[t], engines[t].name,
                        infos[t], run_id, seconds, results[t]) for t in stage}
        catalog.record_all(db, [(rows[t], results[t]) for t in stage])
    except BaseException as err:
        if cancel is not None and cancel.cancelled:  # its futures were cancelled: say so
            err = cancel.error(recorder.run_id if recorder is not None else None)
        try:
            _discard(client, every, engines, created)
        finally:  # the run ends with the call, also when the cleanup is interrupted
            if recorder is not None:
                recorder.fail(err)
        if isinstance(err, RunCancelled):
            raise err from None
        if isinstance(err, DeepxError) or not isinstance(err, Exception):
            raise
        raise ExecutionError(f"materializing {', '.join(map(str, stage))} failed: "
                             f"{type(err).__name__}: {err}") from err
    finally:
        if cancel is not None:
            cancel.forget(every)
        for f in every:
            f.release()
    if recorder is not None:
        recorder.finish()
    for t in stage:
        written[t], checks[t] = rows[t], results[t]
    return run_id


def _owners(plan, outputs) -> dict:
    """Fused node id -> the recovery settings of the asset whose tasks compute it, for the
    assets that have their own. `outputs` is (output name, recovery) per target, upstream
    first: a node belongs to the first target that reaches it from its output."""
    nodes = {n.id: n for n in plan.fused.nodes}
    out_id = dict(plan.fused.outputs)
    owners, seen = {}, set()
    for name, recovery in outputs:
        todo = [out_id[name]]
        while todo:
            node_id = todo.pop()
            if node_id in seen:
                continue
            seen.add(node_id)
            if recovery is not None:
                owners[node_id] = recovery
            todo += nodes[node_id].inputs
    return owners


def _row(a, t: Target, version, used, node, storage, info, run_id, seconds,
         results) -> AssetMaterialization:
    return AssetMaterialization(
        version=version, asset=t.asset, partition=t.partition, code_version=a.code_version,
        upstream_versions=json.dumps(used, sort_keys=True), shape=json.dumps(list(node.shape)),
        dtype=node.dtype, chunks=json.dumps(list(info.get("chunks") or ())),
        nbytes=info.get("nbytes"), storage=storage, uri=info.get("uri"),
        manifest_digest=info.get("manifest_digest"), run_id=run_id,
        seconds=seconds, checks_passed=all(r.passed for r in results) if results else None,
        created_at=time.time())


def _discard(client, futures, engines, created) -> None:
    """After a failure: stop the stage's tasks (a write still running could otherwise
    recreate what is deleted), then delete every array it created. Best effort."""
    cancel_and_settle(client, futures)
    for t, uri in created.items():
        try:
            engines[t].delete(uri)
        except Exception:  # no row points at it, so it is never read
            pass


def _check_outputs(t: Target, check, tensor: Tensor, prefix: str, outputs: dict):
    """Add the tensors `check` measures on `tensor` to the graph's outputs; their names
    (None for a check that measures nothing on the cluster)."""
    if check.measure is None:
        return None
    try:
        measured = check.measure(tensor)
    except GraphError as err:
        raise GraphError(f"asset {t}: check {check.name}: {err}", err.node) from None
    except Exception as err:  # a user's measure that broke: say whose
        raise GraphError(f"asset {t}: check {check.name} raised {type(err).__name__}: "
                         f"{err}") from err
    if measured is None:
        return None
    parts = measured if isinstance(measured, (tuple, list)) else (measured,)
    names = []
    for k, part in enumerate(parts):
        if not isinstance(part, Tensor):
            raise GraphError(f"asset {t}: check {check.name} must build dx.Tensors, got "
                             f"{type(part).__name__}")
        outputs[f"{prefix}_{k}"] = part
        names.append(f"{prefix}_{k}")
    return names


def _wait_or_raise(client, futures, plan) -> None:
    """Wait for `futures`; at the first that fails, raise its error (naming its operator
    and chunk)."""
    from distributed import as_completed
    # The futures' client need not be the default one (dx.persist's shared client is not).
    for future in as_completed(futures, loop=client.loop):
        if future.status == "error":
            raise task_failure(plan, blamed_key(client, future.key), error_of(future))
        if future.status != "finished":
            raise ExecutionError(f"task {future.key} failed: {why_not_finished(future)}")


def _gather_scalars(client, futures, names, plan, graph) -> tuple:
    from deepx_flow.runtime.run import _gather
    out = []
    for name in names:
        node = plan.graph[dict(graph.outputs)[name]]
        out.append(_gather(client, futures[name], node.shape, node.dtype,
                           plan.partition.chunks[node.id]))
    return tuple(out) if len(out) > 1 else out[0]


def _verdict(check, values, node) -> AssetCheckResult:
    try:
        v = check.judge(values, node.shape, node.dtype)
        passed, value, message = bool(v.passed), v.value, str(v.message)
        value = None if value is None else float(value)
    except Exception as err:  # a user's predicate that raised: the check failed
        passed, value, message = False, None, f"the check raised {type(err).__name__}: {err}"
    if value is not None and not math.isfinite(value):
        value = None  # NaN and inf do not store on every backend; the message says it
    return AssetCheckResult(materialization_id=0, check=check.name, passed=bool(passed),
                            blocking=check.blocking, value=value, message=message,
                            created_at=time.time())


def _uri(engine, t: Target, version: str) -> str:
    if engine.name == "memory":
        return f"memory://{t.asset}/{t.partition + '/' if t.partition else ''}{version}"
    part = f"/{t.partition.replace(':', '-')}" if t.partition else ""
    return f"{asset_root().rstrip('/')}/{t.asset}{part}/{version}.zarr"


__all__ = ["Materialized", "materialize", "asset_root"]
