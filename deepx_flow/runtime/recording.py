"""The driver side of run recording: a run's row, then its tasks and chunk placements.

`RunRecorder.start` writes the run (status "running") and its graph; the scheduler plugin
(`recorder_plugin.py`) is told which keys are this run's (`RunRecorder.tracking`) in the
round trip that starts the run there (`begin.py`). While the run goes, a
thread drains the plugin's buffer every `FLUSH_INTERVAL_S` and writes it in one
transaction, so recording costs the run a few batched writes, not one per task. `finish`
sets the outcome, drains the rest for the last time and ends the run, in one transaction
with the run's operator speeds (a small run is then two transactions in all: its row, and
its end); if that fails, each part is written on its own, so what can be recorded is. A
persist is finished as soon as its last chunk is done (a callback on each future wakes the
thread), so its outcome and its last records are written while its client is still there
to read them from.

A run ends after every task of it: one that succeeded, with tasks still running (a
training's graph of steps has its outcome when its losses are back, while the tasks taking
out its parameters may still run), is drained until they are done (up to
`LAND_TIMEOUT_S`), and its end is when its outcome was known or its last task ended,
whichever is later. A run that failed or was interrupted ends at once; tasks of it that
finish later are written in it by the next drain of any run recorded in the same database,
or as this process exits.

Recording is on unless `DEEPX_RECORD=0`.
"""

from __future__ import annotations

import atexit
import contextlib
import getpass
import hashlib
import json
import logging
import math
import os
import threading
import time
import uuid
import weakref

from deepx_flow.compiler.group import group_labels
from deepx_flow.config import settings
from deepx_flow.ir.keys import chunk_index, key_name, node_of
from deepx_flow.ir.program import operator_label
from deepx_flow.meta import open_db, store
from deepx_flow.registry.speeds import SpeedSamples
from deepx_flow.meta.models import Run
from deepx_flow.processes import this_process
from deepx_flow.runtime import recorder_plugin
from deepx_flow.runtime.futures import describe_error, why_not_finished

FLUSH_INTERVAL_S = 1.0
# How long a run that succeeded waits for its tasks still running before it is ended anyway
# (their rows are then written in it later, as a failed run's are).
LAND_TIMEOUT_S = 30.0
LAND_POLL_S = 0.25  # each drain waits this long at most (the scheduler wakes it sooner)
# CPU seconds this process's threads have spent draining and writing records (the
# benchmark reads it; CPU time, so time spent waiting for the scheduler is not counted).
seconds_spent = 0.0

log = logging.getLogger(__name__)


class RunRecorder:
    """Records one run of a compiled plan in the metadata database."""

    def __init__(self, db, client, run_id: str, labels: dict, places: dict):
        self.db, self.client, self.run_id = db, client, run_id
        self.labels = labels  # node id -> operator label
        self.places = places  # worker address -> (tier, device name)
        self._lock = threading.Lock()
        self._done = threading.Event()  # stop the background drains
        self._wake = threading.Event()  # stop, or every future `watch` was given is done
        self._ended = threading.Event()  # the run's outcome and end are written
        self._force = threading.Event()  # end it without waiting for its tasks
        # run id -> (tasks, placements, events) a failed write left for the next flush
        self._pending: dict[str, tuple[list, list, list]] = {}
        self._thread = None
        self.futures = None
        self._unfinished = 0  # futures `watch` was given that are not done yet
        self._counting = threading.Lock()  # for _unfinished (callbacks come from a pool)
        self.status = "running"
        self.decided_at: float | None = None  # when its outcome was known
        self.last_stop = 0.0  # the latest end of its tasks drained so far
        self.speeds: SpeedSamples | None = None  # finished tasks, for the registry's speeds

    @property
    def tracking(self) -> dict:
        """The arguments of `recorder_plugin.track` but the key names."""
        return dict(run_id=self.run_id, store=self.db.identity, client=self.client.id,
                    labels=self.labels)

    @classmethod
    def start(cls, plan, lowered, client, inlined: dict, kind: str = "run",
              db=None, explain: str | None = None) -> "RunRecorder | None":
        """Write the run's row (in `db`, a Database; default the configured one); None when
        recording is off or cannot be set up (a warning says why: the run itself goes
        ahead). `inlined` is `inline.inlined_nodes` of the lowered graph; `explain` the
        plan's text to record where it is more than `plan.explain()` (a training step's,
        with the placement of its parameters). The caller has the scheduler track the run's
        keys (`tracking`)."""
        if not settings().record:
            return None
        run_id = uuid.uuid4().hex
        try:
            return cls._start(run_id, plan, lowered, client, inlined, kind, db, explain)
        except Exception as err:
            log.warning("deepx_flow: this run is not recorded: %s", err)
            try:  # if its row was written, it must not stay "running"
                store.end_run(db or open_db(), run_id, "failed", f"recording failed: {err}")
            except Exception:
                pass
            return None

    @classmethod
    def _start(cls, run_id, plan, lowered, client, inlined, kind, db,
               explain=None) -> "RunRecorder":
        db = db or open_db()
        graph_yaml, graph_hash = _graph_text(plan)
        stats = plan.stats()
        ratio = stats.compute_comm_ratio
        me = this_process()
        run = Run(
            id=run_id, kind=kind, status="running", started_at=time.time(),
            graph_hash=graph_hash,
            scheduler=str(client.scheduler.address), cluster=plan.cluster.name,
            n_workers=len(plan.cluster.workers), n_tasks=len(lowered.dsk),
            n_chunks=sum(math.prod(len(c) for c in chunks)
                         for chunks in plan.partition.chunks.values()),
            compute_comm_ratio=None if ratio == float("inf") else ratio,
            explain=explain or plan.explain(),
            outputs=json.dumps({name: key for name, (key, _) in lowered.outputs.items()}),
            host=me.host, pid=me.pid, pid_space=me.space, username=_user())
        store.begin_run(db, run, graph_yaml, len(plan.graph.nodes))
        labels = {node.id: operator_label(node) for node in plan.fused.nodes}
        labels.update(group_labels(lowered.dsk, labels))  # a training step's grouped tasks
        places = {w.address: (("device", w.device.name) if w.device and plan.cluster.has_devices
                              else ("host", None)) for w in plan.cluster.workers if w.address}
        recorder = cls(db, client, run.id, labels, places)
        recorder.speeds = SpeedSamples.of_plan(plan, inlined)
        _live.add(recorder)
        return recorder

    def watch(self, futures=None) -> None:
        """Drain in the background until `finish` is called or, given `futures`, until they
        are all done (then finish the run from their outcome, at once: the outcome is read
        while the futures still say it, before their client may close and cancel them)."""
        self.futures = futures
        if futures is not None:
            self._unfinished = len(futures)
            if not futures:
                self._wake.set()
            for future in futures:
                future.add_done_callback(self._future_done)

        def loop():
            while True:
                self._wake.wait(FLUSH_INTERVAL_S)
                if self._done.is_set() or self.finish_if_done():
                    return
                if self.client.status in ("closing", "closed"):  # e.g. at interpreter exit
                    self.finish("its Dask client closed before it finished",
                                status="interrupted", drain=False)
                    return
                self.flush_quietly()
        self._thread = threading.Thread(target=loop, name=f"deepx-record-{self.run_id[:8]}",
                                        daemon=True)
        self._thread.start()

    def _future_done(self, _future) -> None:
        with self._counting:
            self._unfinished -= 1
            if self._unfinished <= 0:
                self._wake.set()

    def add_tasks(self, name: str, label: str) -> None:
        """Record the tasks whose keys are named `name` (a key's first element) as this
        run's, each running `label`: work its driver submits besides the run's graph (the
        writes of its chunks), while the run goes. One round trip, before they are
        submitted; nothing once the run has ended, or when recording fails (a warning)."""
        if self.status != "running":
            return
        labels = {node_of(name): label}
        try:
            self.client.run_on_scheduler(recorder_plugin.add_tasks, run_id=self.run_id,
                                         names=[name], labels=labels)
        except Exception as err:
            log.warning("deepx_flow: tasks %s of run %s are not recorded: %s", name,
                        self.run_id, err)
            return
        self.labels.update(labels)

    def note(self, kind: str, message: str) -> None:
        """Add an event to the run (with the next drain's rows)."""
        with self._lock:
            tasks, placements, events = self._pending.get(self.run_id, ([], [], []))
            self._pending[self.run_id] = (tasks, placements, events + [
                (time.time(), kind, None, None, message)])

    def flush(self, settle_keys=(), final: bool = False) -> None:
        """Write what the scheduler has buffered for this run (and for runs that have ended
        since). With `settle_keys` (keys this client just released), first let the scheduler
        process the release; `final`: the last drain of this run (it ends now)."""
        global seconds_spent
        began = time.thread_time()
        with self._lock:
            self._drain(settle_keys, final, force=final)
            store.write_run_records(self.db, self._pending)
            self._pending = {}
            seconds_spent += time.thread_time() - began

    def _drain(self, settle_keys, final: bool, land_s: float = 0.0,
               force: bool = False) -> tuple[bool, int]:
        """Take what the scheduler buffered into `_pending` (under `_lock`); whether the run
        has ended there (`final`: its last drain, once its tasks are done or with `force`;
        see `RecorderPlugin.drain`), and how many of its tasks are still running."""
        out = self.client.run_on_scheduler(
            recorder_plugin.drain, run_ids=[self.run_id], settle_keys=list(settle_keys),
            client_id=self.client.id, final=final, store=self.db.identity, land_s=land_s,
            force=force)
        # The plugin forgot these rows when it handed them over: keep them until written.
        pending = self._pending
        for run_id, records in out.items():
            tasks, placements, events = self._rows(run_id, records)
            before = pending.get(run_id, ([], [], []))
            pending[run_id] = (before[0] + tasks, before[1] + placements, before[2] + events)
        mine = out.get(self.run_id, {})
        return bool(mine.get("ended")), mine.get("going", 0)

    def _rows(self, run_id: str, records: dict) -> tuple[list, list, list]:
        """Plugin tuples (recorder_plugin.*_FIELDS) -> table rows (store.*_COLUMNS)."""
        # Another run's records (it ended before all its tasks did) come with its labels.
        labels = self.labels if run_id == self.run_id else records.get("labels", {})
        places = self.places
        speeds = self.speeds if run_id == self.run_id else None
        tasks = []
        last = 0.0
        for key, *rest in records["tasks"]:
            tensor = key_name(key)
            tasks.append((str(key), tensor, labels.get(node_of(key), "?"), *rest))
            worker, start, stop, status = rest[0], rest[1], rest[2], rest[6]
            if stop is not None and stop > last:
                last = stop
            if status == "memory" and speeds is not None:
                speeds.add(node_of(key), worker, start, stop)
        if run_id == self.run_id:
            self.last_stop = max(self.last_stop, last)
        placements = []
        for key, worker, state, nbytes, at in records["placements"]:
            name = key_name(key)
            # Chunks copied to host memory for gathering (".host" keys) are not on a GPU.
            tier, device = ("host", None) if name.endswith(".host") else \
                places.get(worker, ("host", None))
            placements.append((name, chunk_index(key), worker, device,
                               "disk" if state == "spilled" else tier, nbytes, state, at))
        return tasks, placements, [tuple(e) for e in records["events"]]

    def finish(self, error: str | None = None, settle_keys=(), status: str | None = None,
               drain: bool = True) -> None:
        """Set the run's outcome: `status`, else failed when `error` is given, else
        succeeded; drain the rest and end the run, once every task of a run that succeeded
        is done (see the module docstring). Once: a second caller waits until the first has
        ended it."""
        with self._lock:
            first = self.status == "running"
            if first:
                self.status = status or ("failed" if error else "succeeded")
                self.decided_at = time.time()
        if not first:
            if self._thread is not threading.current_thread():
                self._ended.wait(timeout=LAND_TIMEOUT_S + 30)
            return
        self._done.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            if drain and self._finish_at_once(settle_keys, error):
                return
            # Step by step, so that what can be written is: the records, the outcome, the
            # operator speeds.
            if drain:
                self.flush_quietly(settle_keys, final=True)
            try:
                store.end_run(self.db, self.run_id, self.status, error, self._ended_at())
            except Exception as err:
                log.warning("deepx_flow: could not record the end of run %s: %s",
                            self.run_id, err)
            if self.status == "succeeded" and self.speeds is not None:
                try:
                    self.speeds.record(self.db)  # the registry learns its operators' speeds
                except Exception as err:
                    log.warning("deepx_flow: could not record the operator speeds of run "
                                "%s: %s", self.run_id, err)
        finally:
            _live.discard(self)
            self._ended.set()

    def _finish_at_once(self, settle_keys, error: str | None) -> bool:
        """The last drain, the run's end and its operator speeds in one transaction
        (`store.finish_run`), once its tasks are done (a run that succeeded waits for them,
        drained meanwhile); False, having written nothing more, if any of it failed. The
        drained rows stay in `_pending` until written, so `finish` can go step by step."""
        global seconds_spent
        if self.client.status in ("closing", "closed"):
            return False
        began = time.thread_time()
        speeds = self.speeds if self.status == "succeeded" else None
        deadline = time.monotonic() + LAND_TIMEOUT_S
        try:
            while True:
                left = deadline - time.monotonic()
                force = self.status != "succeeded" or self._force.is_set() or left <= 0
                with self._lock:
                    ended, going = self._drain(settle_keys, final=True, force=force,
                                               land_s=0.0 if force else min(LAND_POLL_S, left))
                    settle_keys = ()
                    if ended:
                        store.finish_run(self.db, self.run_id, self.status, error,
                                         self._pending, ended_at=self._ended_at(),
                                         also=speeds.record_on if speeds is not None
                                         else None)
                        self._pending = {}
                        break
                    store.write_run_records(self.db, self._pending)  # while it waits
                    self._pending = {}
        except Exception:
            return False
        finally:
            seconds_spent += time.thread_time() - began
        if going or force:  # tasks of it may still finish: what they do is written later
            _late[(self.client.id, self.db.identity)] = self
        return True

    def _ended_at(self) -> float:
        """When the run ended: its outcome was known, and its last task had ended (as its
        worker reported it: a worker's clock may run a little ahead of this one)."""
        return max(self.decided_at or time.time(), self.last_stop)

    def fail(self, err: BaseException) -> None:
        """Finish after the driver saw `err`, at once: interrupted for Ctrl-C or a
        cancellation (`runtime/cancel.py`), else failed (a run whose outcome was known
        already keeps it, and ends now)."""
        from deepx_flow.runtime.cancel import RunCancelled
        self._force.set()
        self.finish(error=describe_error(err),
                    status="interrupted" if isinstance(err, (KeyboardInterrupt, RunCancelled))
                    else None)

    def finish_if_done(self) -> bool:
        """Finish the run if all the futures `watch` was given are done; say if it was."""
        if self.futures is None or not all(f.done() for f in self.futures):
            return False
        self.finish_from(self.futures)
        return True

    def finish_from(self, futures) -> None:
        """`finish`, with the error of the first failed future if any; interrupted when
        some were cancelled (released or their client closed) before they finished."""
        if any(f.status == "cancelled" for f in futures):
            self.finish("cancelled before it finished", status="interrupted")
            return
        failed = next((f for f in futures if f.status == "error"), None)
        self.finish(None if failed is None else f"{failed.key}: {why_not_finished(failed)}")

    def flush_quietly(self, settle_keys=(), final: bool = False) -> None:
        """`flush`, logging instead of raising: recording must never fail a run."""
        if self.client.status in ("closing", "closed"):
            return  # nothing to drain from; the buffered records went with the scheduler
        try:
            self.flush(settle_keys, final)
        except Exception as err:
            log.warning("deepx_flow: could not record run %s: %s", self.run_id, err)


@contextlib.contextmanager
def ended_by(recorder: RunRecorder | None):
    """End the run `recorder` records with the block: failed with the error it raises
    (interrupted for Ctrl-C), else succeeded. Nothing when recording is off (None). For the
    calls that start a run and return only once it is done: every run a call starts is
    finished by that call, so none is left `running` for the next process to find."""
    try:
        yield
    except BaseException as err:
        if recorder is not None:
            recorder.fail(err)
        raise
    if recorder is not None:
        recorder.finish()


# Recorders of runs not yet ended: at interpreter exit they are marked interrupted (or, with
# their outcome known, ended at once).
_live: "weakref.WeakSet[RunRecorder]" = weakref.WeakSet()
# (client id, database) -> a recorder whose run was ended while tasks of it may still run:
# at exit, what they did since is drained (any drain in that database takes it).
_late: dict = {}


@atexit.register
def _interrupt_live_runs() -> None:
    for recorder in list(_live):
        recorder._force.set()
        recorder.finish("the process that started the run exited before it finished",
                        status="interrupted", drain=False)
    for recorder in list(_late.values()):
        if recorder.client.status == "running":  # not while it reconnects to a lost one
            recorder.flush_quietly()
    _late.clear()


# The YAML text and hash of the graphs recorded last, by the graph object: a plan from the
# plan cache (`plan_cache.py`) holds the same graph object run after run, and writing it out
# was most of what starting a record cost.
def _graph_text(plan) -> tuple[str, str]:
    """The plan's graph as YAML (`spec/writer.py`) and its hash, the run row's `graph_hash`;
    kept on the plan, which the plan cache hands to every run of the same graph."""
    kept = plan.__dict__.get("_graph_text")
    if kept is None:
        from deepx_flow.spec.writer import graph_yaml
        text = graph_yaml(plan.graph)
        kept = (text, hashlib.sha256(text.encode()).hexdigest()[:16])
        object.__setattr__(plan, "_graph_text", kept)  # frozen: a memo, as `Plan.stats`'s
    return kept


def _install_plugins(client) -> None:
    """Register the scheduler plugin (and the workers' spill reporter) once per cluster."""
    installed = client.run_on_scheduler(_has_plugin)
    if not installed:
        client.register_plugin(recorder_plugin.RecorderPlugin())
        client.register_plugin(recorder_plugin.SpillReporter())


def _has_plugin(dask_scheduler) -> bool:
    return recorder_plugin.PLUGIN_NAME in dask_scheduler.plugins


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no name for this uid (containers)
        return str(os.getuid()) if hasattr(os, "getuid") else "?"
