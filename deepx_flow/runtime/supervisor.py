"""The scheduler side of recovery: a Dask scheduler plugin that feeds each run's `RunWatch`
(`drift.py`) with the scheduler's events and carries out its decisions.

It is the thin shell around the pure decisions, and the only code that changes the
scheduler's task state:
- a backup of a slow task is a copy of it under another key (`backup_key`), on the same
  inputs, restricted to the other workers and wanted by the supervisor itself. If it
  finishes first, the slow attempt is released on its worker and the key is rewritten to
  take the backup's result where it lies (an identity task on that worker); if the first
  attempt finishes first, the backup is released. Either way the loser's work is dropped;
- a drift sets the task's worker restrictions to the workers it may use, and releases it on
  its worker, which drops the attempt; Dask then runs it again. The restrictions are strict
  (Dask's work stealing moves a task with loose ones to any idle worker, the excluded one
  too); when the last worker a task may use leaves, they become loose, so the run goes on;
- excluding a worker restricts every unfinished task of the run to the others (and to
  workers that join later); a worker whose device is lost also has the tasks it was sent
  but has not finished taken back;
- a task that keeps timing out, or a run with no workers left, is failed with an error
  that says why (futures of the run raise it).

It also counts each run's finished tasks and the bytes they made, which the driver's progress
bar reads (`progress.py`).

A chunk of a stored asset lost with its worker is read back from storage instead of being
computed again, where the cost model says that is cheaper (`readback.py`): the task is
rewritten into a read of its region, without dependencies.

It also keeps the attempt counters the task wrapper (`kernels/attempt.py`) reads from the
task's annotations, and gives a task that failed on a lost device a retry that does not
count against its own. What it did goes into the run's events, which the recorder drains.
"""

from __future__ import annotations

import logging
import time

from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin

from deepx_flow.compiler.taskspec import ref, task
from deepx_flow.ir.keys import key_name, node_of
from deepx_flow.kernels.attempt import ATTEMPT_TOPIC
from deepx_flow.runtime.drift import (Drift, Exclude, FailTask, GiveUp, RunWatch, Speculate,
                                      Suspect)
from deepx_flow.runtime.inputs import load_region
from deepx_flow.runtime.readback import StoreRate, decide, nothing_to_write

log = logging.getLogger(__name__)

PLUGIN_NAME = "deepx-supervisor"
TICK_MS = 250
IDLE_FORGET_S = 3600.0  # a run with nothing running for this long is forgotten
MAX_DEVICE_RETRIES = 3  # free retries of one task after device losses
UNFINISHED = ("released", "waiting", "no-worker", "queued", "processing")
BACKUP_SUFFIX = "~backup"
CLIENT = "deepx-supervisor"  # the scheduler-side client that wants backups while they run


def backup_key(key):
    """The key of `key`'s backup attempt: its name with BACKUP_SUFFIX, same chunk index."""
    return (key[0] + BACKUP_SUFFIX, *key[1:]) if isinstance(key, tuple) else \
        str(key) + BACKUP_SUFFIX


def backed_up_key(key):
    """The key a backup key backs up; None for any other key."""
    name = key_name(key)
    if not name.endswith(BACKUP_SUFFIX):
        return None
    name = name[:-len(BACKUP_SUFFIX)]
    return (name, *key[1:]) if isinstance(key, tuple) else name


def take(value):
    """Task: a key's result taken from its backup's (the identity; a backup that finished
    first hands its result over this way, on the worker that holds it)."""
    return value


class TaskTimedOut(Exception):
    """A task kept running past its time limit on every worker that tried it."""


class NoWorkers(Exception):
    """A run had no workers for longer than it was willing to wait."""


class Supervisor(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.scheduler = None
        self.watches: dict[str, RunWatch] = {}
        self.run_of: dict[str, str] = {}  # key name -> run id
        self.names: dict[str, set] = {}  # run id -> its key names
        self.events: dict[str, list] = {}
        self.restricted: dict[str, set] = {}  # run id -> keys restricted away from workers
        self.device_retries: dict = {}  # key -> free retries given
        self.last_active: dict[str, float] = {}
        self.lost_devices: dict[str, str] = {}  # worker -> the error that lost its device
        self.failing: set = set()  # keys whose attempt reported an error, not yet ended
        self.readable: dict[str, dict] = {}  # run id -> {chunk key: readback.Stored}
        self.writes: set = set()  # keys of tasks storing chunks of watched runs
        self.written: set = set()  # those that finished
        self.store_rates: dict[str, StoreRate] = {}
        self.orphans: set = set()  # keys a read-back left without dependents, to forget
        self.backups: set = set()  # keys with a backup task (`backup_key`) on the scheduler
        self.handed_over: set = set()  # keys rewritten to take their backup's result
        self.waiting_since: dict = {}  # key -> first heartbeat that saw it wait on an idle worker
        self.finished: dict[str, dict] = {}  # run id -> {key: bytes} of its finished tasks
        self.callback = None

    async def start(self, scheduler) -> None:
        from tornado.ioloop import PeriodicCallback
        self.scheduler = scheduler
        self.callback = PeriodicCallback(self._tick, TICK_MS)
        self.callback.start()

    async def close(self) -> None:
        if self.callback is not None:
            self.callback.stop()

    # -- called by the driver ------------------------------------------------------------------

    def watch(self, run_id: str, names, policies, exclude_after: int, worker_wait: float,
              readable=None):
        """Watch a run; `readable` maps chunk keys it stores to their `readback.Stored`."""
        self.watches[run_id] = RunWatch(policies, node_of, exclude_after, worker_wait,
                                        peers_of=key_name)
        if readable:
            self.readable[run_id] = dict(readable)
            self.store_rates[run_id] = StoreRate()
            for stored in readable.values():
                for write in stored.writes:
                    self.writes.add(write)
                    ts = self.scheduler.tasks.get(write)
                    if ts is not None and ts.state == "memory":  # finished before we heard
                        self.written.add(write)
        self.names[run_id] = set(names)
        self.finished.setdefault(run_id, {})
        self.events.setdefault(run_id, [])
        self.last_active[run_id] = time.time()
        for name in names:
            self.run_of[name] = run_id
        for worker, error in self.lost_devices.items():  # no new work for a broken device
            self._apply(run_id, self.watches[run_id].device_failed(None, worker,
                                                                   "device lost", error))
        # A run started with no workers waits for one from now.
        self._apply(run_id, self.watches[run_id].workers(len(self.scheduler.workers),
                                                         time.time()))

    def pop_events(self, run_id: str) -> list:
        events = self.events.get(run_id, [])
        self.events[run_id] = []
        return events

    def forget(self, run_id: str) -> None:
        names = self.names.pop(run_id, ())
        for name in names:
            if self.run_of.get(name) == run_id:
                del self.run_of[name]
        for key in [k for k in self.backups if key_name(k) in names]:
            self._release_backup(key)
        for table in (self.watches, self.events, self.restricted, self.last_active,
                      self.store_rates, self.finished):
            table.pop(run_id, None)
        for stored in self.readable.pop(run_id, {}).values():
            self.writes.difference_update(stored.writes)
            self.written.difference_update(stored.writes)

    # -- scheduler hooks -----------------------------------------------------------------------

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs) -> None:
        run_id = self.run_of.get(key_name(key))
        if run_id is None:
            return
        watch = self.watches[run_id]
        now = time.time()
        self.last_active[run_id] = now
        original = backed_up_key(key)
        if original is not None:
            self._backup_transition(run_id, original, key, start, finish, now)
            return
        if finish == "processing":
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.processing_on is not None:
                if key in self.handed_over:
                    watch.stopped(key)  # taking the backup's result: not an attempt to time
                else:
                    watch.started(key, ts.processing_on.address, now)
        elif start == "processing":
            self.waiting_since.pop(key, None)
            if finish == "memory":
                done, ts = self.finished.get(run_id), self.scheduler.tasks.get(key)
                if done is not None:  # by key: a chunk computed again counts once
                    done[key] = (ts.nbytes or 0) if ts is not None else 0
                took = watch.finished(key, now)
                if key in self.writes:
                    self._stored(run_id, key, took)
                if key in self.handed_over:
                    self.handed_over.discard(key)
                    self.scheduler.tasks[key].worker_restrictions = None
                elif key in self.backups:  # it won: its backup is not needed
                    self._later(self._drop_backup, run_id, key, "the first attempt finished "
                                                                "first")
            else:
                watch.stopped(key)
                if finish == "erred" and key in self.backups:
                    self._later(self._drop_backup, run_id, key, "the first attempt failed")
            if key in self.failing:
                self.failing.discard(key)
                if finish == "released":  # Dask retries it (processing -> released -> waiting)
                    self._annotate(key, "deepx_failed", 1)
        if finish == "released" and key in self.handed_over:
            self._take_from_backup(run_id, key)
        elif finish == "released" and run_id in self.readable:
            self._read_back_lost(run_id, key)
        if finish == "forgotten":
            self.device_retries.pop(key, None)
            self.handed_over.discard(key)
            if key in self.backups:  # nobody wants it any more (a cancelled run)
                self._later(self._drop_backup, run_id, key, "the task was released")

    def update_graph(self, scheduler, *, tasks=(), **kwargs) -> None:
        """New tasks of a run that excludes workers: restricted before they are scheduled."""
        for key in tasks:
            run_id = self.run_of.get(key_name(key))
            watch = self.watches.get(run_id)
            ts = self.scheduler.tasks.get(key)
            if watch is not None and watch.excluded and ts is not None \
                    and ts.state in UNFINISHED:
                self._restrict(run_id, ts, watch.excluded)

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        self.lost_devices.pop(worker, None)
        self._count_workers()
        self._loosen_stranded()

    def add_worker(self, scheduler, worker: str) -> None:
        self._count_workers()
        for run_id, ts in self._restricted_unfinished():
            if worker not in self.watches[run_id].excluded \
                    and ts.worker_restrictions is not None:
                ts.worker_restrictions.add(worker)

    def log_event(self, topic, msg) -> None:
        if topic != ATTEMPT_TOPIC or not isinstance(msg, dict):
            return
        key = msg["key"]
        key = tuple(key) if isinstance(key, list) else key
        run_id = self.run_of.get(key_name(key))
        if run_id is None:
            return
        self.failing.add(key)
        if msg.get("kind") != "device-lost":
            return
        watch, worker = self.watches[run_id], msg["worker"]
        self.lost_devices[worker] = msg["error"]
        self._note(run_id, "device-lost", worker, key, msg["error"])
        ts = self.scheduler.tasks.get(key)
        given = self.device_retries.get(key, 0)
        if ts is not None and given < MAX_DEVICE_RETRIES:
            # Not the task's fault: Dask's retry (coming when it hears of the error) is free.
            self.device_retries[key] = given + 1
            ts.retries += 1
        self._apply(run_id, watch.device_failed(key, worker, "device lost", msg["error"]))
        if ts is not None:  # still processing, so not restricted with the rest: its retry is
            self._restrict(run_id, ts, watch.excluded)
        for other_id, other in self.watches.items():  # the device is gone for every run
            if other_id != run_id:
                self._apply(other_id, other.device_failed(None, worker, "device lost",
                                                          msg["error"]))
        self._move_off(worker, keep=key)

    # -- time ----------------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.orphans:
            self._forget_orphans()
        now = time.time()
        for run_id, watch in list(self.watches.items()):
            if not watch.running and now - self.last_active.get(run_id, now) > IDLE_FORGET_S:
                self.forget(run_id)
                continue
            try:
                self._follow_steals(watch)
                self._apply(run_id, watch.tick(now, lambda key: self._running_for(key, now),
                                               self._short_of_memory))
            except Exception:  # one run's trouble must not stop the watch over the others
                log.exception("deepx_flow: the supervisor failed watching run %s", run_id)

    def _follow_steals(self, watch: RunWatch) -> None:
        """Tell `watch` where its running tasks are now: work stealing moves them between
        workers without a transition, and a backup must avoid the worker that holds it."""
        tasks = self.scheduler.tasks
        for key, attempt in watch.running.items():
            ts = tasks.get(key)
            if ts is not None and ts.processing_on is not None \
                    and ts.processing_on.address != attempt.worker:
                watch.moved(key, ts.processing_on.address)

    def _short_of_memory(self, address: str) -> bool:
        """Whether the worker at `address` is paused or has data spilled to disk, as its
        last heartbeat says."""
        ws = self.scheduler.workers.get(address)
        return ws is not None and (ws.status == Status.paused or ws.memory.spilled > 0)

    def _running_for(self, key, now: float) -> float | None:
        """Seconds `key`'s attempt has run on its worker, from the worker's heartbeats: while
        it executes, how long it has; while it waits on a worker whose threads do no work of
        ours (idle, or still running an attempt that was dropped: a Python thread cannot be
        stopped; a task the worker never got looks like that too), how long it has waited
        so; while it is queued behind the worker's other work, None. A heartbeat is a
        snapshot, and a late one is stale (a worker that has since started the task looks
        idle with it waiting): waiting is measured between heartbeats that each saw it, sent
        after the task went to the worker, and stops counting at one that did not."""
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.processing_on is None:
            return None
        ws = ts.processing_on
        if ts in ws.executing:
            self.waiting_since.pop(key, None)
            return ws.executing[ts] + max(0.0, now - ws.last_seen)
        watch = self.watches.get(self.run_of.get(key_name(key)))
        attempt = watch.running.get(key) if watch is not None else None
        if attempt is not None and ws.last_seen > attempt.since \
                and sum(1 for t in ws.executing if t.processing_on is ws) < ws.nthreads:
            return ws.last_seen - self.waiting_since.setdefault(key, ws.last_seen)
        self.waiting_since.pop(key, None)
        return None

    def _forget_orphans(self) -> None:
        """Forget what read-backs left with nothing to compute it for (it would otherwise stay
        on the scheduler, and in memory, until the cluster closes)."""
        recs = {}
        for key in self.orphans:
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.state in ("released", "memory") and not ts.dependents \
                    and not ts.who_wants and not ts.waiters:
                recs[key] = "forgotten"
        self.orphans.clear()
        if recs:
            self.scheduler.transitions(recs, stimulus_id=f"deepx-readback-{time.time()}")

    def _count_workers(self) -> None:
        now = time.time()
        for run_id, watch in list(self.watches.items()):
            self._apply(run_id, watch.workers(len(self.scheduler.workers), now))

    # -- carrying out decisions ----------------------------------------------------------------

    def _apply(self, run_id: str, actions) -> None:
        for action in actions:
            if isinstance(action, Speculate):
                self._speculate(run_id, action)
            elif isinstance(action, Drift):
                self._drift(run_id, action)
            elif isinstance(action, Suspect):
                self._note(run_id, "suspect", action.worker, None, action.reason)
            elif isinstance(action, Exclude):
                self._exclude(run_id, action)
            elif isinstance(action, FailTask):
                self._note(run_id, "timed-out", action.worker, action.key, action.reason)
                self._fail([action.key], TaskTimedOut(f"task {action.key} {action.reason}"))
            elif isinstance(action, GiveUp):
                self._note(run_id, "no-workers", None, None, action.reason)
                keys = [k for k, ts in self.scheduler.tasks.items()
                        if key_name(k) in self.names.get(run_id, ()) and ts.state in UNFINISHED]
                self._fail(keys, NoWorkers(action.reason))

    # -- backups of slow tasks -----------------------------------------------------------------

    def _speculate(self, run_id: str, action: Speculate) -> None:
        """Start a backup of `action.key`: its task under `backup_key`, on the same inputs,
        on a worker other than the ones to avoid; the supervisor's own client wants it."""
        from dask._task_spec import Task
        tasks = self.scheduler.tasks
        ts = tasks.get(action.key)
        allowed = {w for w in self.scheduler.workers if w not in action.avoid}
        if ts is None or ts.state != "processing" or not allowed \
                or not isinstance(ts.run_spec, Task):
            self.watches[run_id].backup_stopped(action.key)
            return
        key = backup_key(action.key)
        if key in tasks:
            return
        spec = ts.run_spec
        bts = self.scheduler.new_task(key, Task(key, spec.func, *spec.args, **spec.kwargs),
                                      "released")
        for dts in ts.dependencies:
            bts.add_dependency(dts)
        bts.priority, bts.annotations = ts.priority, dict(ts.annotations or {})
        self._same_span(bts, ts)
        bts.worker_restrictions, bts.loose_restrictions = allowed, False
        self.run_of[key_name(key)] = run_id
        self.names.setdefault(run_id, set()).add(key_name(key))
        self.restricted.setdefault(run_id, set()).add(key)
        self.backups.add(action.key)
        recorder = self.scheduler.plugins.get("deepx-recorder")
        if recorder is not None:  # the backup's attempt gets its own task row
            recorder.track(run_id, [key_name(key)])
        self._note(run_id, "backup", action.worker, action.key, action.reason)
        self.scheduler.client_desires_keys([key], CLIENT)
        self.scheduler.transitions({key: "waiting"},
                                   stimulus_id=f"deepx-backup-{time.time()}")

    def _same_span(self, new, like) -> None:
        """Put task `new` (made here, not by a graph submission) in the span of `like`:
        workers report metrics per span, and the scheduler needs every task in one."""
        spans = self.scheduler.extensions.get("spans")
        span_id = like.group.span_id
        if new.group.span_id is None and span_id is not None and spans is not None:
            new.group.span_id = span_id
            spans.spans[span_id].groups.add(new.group)

    def _backup_transition(self, run_id, original, key, start, finish, now) -> None:
        watch = self.watches[run_id]
        ts = self.scheduler.tasks.get(key)
        if finish == "processing" and ts is not None and ts.processing_on is not None:
            watch.backup_started(original, ts.processing_on.address, now)
        elif start == "processing" and finish == "memory":
            first = self.scheduler.tasks.get(original)
            if first is None or first.state == "memory" or original not in self.backups:
                return  # the first attempt finished first; the backup is being dropped
            attempt = watch.running.get(original)
            since = attempt.since if attempt is not None else now
            # The key takes the backup's result first; then its worker is judged (excluding
            # it takes back the tasks it has not started, which must not include this one).
            self._later(self._hand_over, run_id, original, since)
            self._later(self._apply, run_id, watch.backup_finished(original, now))
        elif start == "processing" and finish == "erred":
            watch.backup_stopped(original)
            self._later(self._drop_backup, run_id, original, "the backup failed")

    def _hand_over(self, run_id: str, key, since: float) -> None:
        """The backup of `key` finished first: release the slow attempt (begun at `since`) on
        its worker and have `key` take the backup's result (`_take_from_backup`, when it is
        released)."""
        ts = self.scheduler.tasks.get(key)
        bts = self.scheduler.tasks.get(backup_key(key))
        if ts is None or bts is None or bts.state != "memory" or ts.state == "memory" \
                or key not in self.backups:
            return
        slow = ts.processing_on.address if ts.processing_on is not None else None
        recorder = self.scheduler.plugins.get("deepx-recorder")
        if recorder is not None and slow is not None:
            recorder.attempt_ended(key, slow, since, "superseded",
                                   f"its backup on {next(iter(bts.who_has)).address} "
                                   f"finished first")
        self._note(run_id, "backup-won", slow, key, f"the backup of {key} finished first; "
                                                    f"the attempt on {slow} is dropped")
        self.handed_over.add(key)
        self.scheduler.transitions({key: "released"},
                                   stimulus_id=f"deepx-backup-won-{time.time()}")

    def _take_from_backup(self, run_id: str, key) -> None:
        """`key` (released) takes its backup's result: an identity task on the worker that
        holds it, with the backup as its only dependency (the backup keeps the original's
        lineage, should the result be lost later)."""
        ts = self.scheduler.tasks[key]
        backup = backup_key(key)
        bts = self.scheduler.tasks.get(backup)
        self.backups.discard(key)
        if bts is None or not bts.who_has:
            self.handed_over.discard(key)
            return
        self._rewrite(ts, task(key, take, ref(backup)))
        ts.add_dependency(bts)
        ts.worker_restrictions = {ws.address for ws in bts.who_has}
        ts.loose_restrictions = False
        # Loosened like any restricted task should that worker go before it runs.
        self.restricted.setdefault(run_id, set()).add(key)
        # Once `key` waits on it (later in these transitions) the backup is held for it.
        self._later(self._release_wanted, backup, "deepx-backup-taken")

    def _drop_backup(self, run_id: str, key, why: str) -> None:
        """The backup of `key` is not needed: release it (its worker drops the attempt)."""
        if key not in self.backups:
            return
        watch = self.watches.get(run_id)
        began = watch.backups.get(key) if watch is not None else None
        bts = self.scheduler.tasks.get(backup_key(key))
        recorder = self.scheduler.plugins.get("deepx-recorder")
        if recorder is not None and bts is not None and bts.state == "processing" \
                and bts.processing_on is not None and began is not None:
            recorder.attempt_ended(bts.key, bts.processing_on.address, began.since,
                                   "superseded", why)
        if watch is not None:
            watch.backup_stopped(key)
        self._note(run_id, "backup-dropped", None, key, why)
        self._release_backup(key)

    def _release_backup(self, key) -> None:
        """Stop wanting the backup of `key`: Dask drops it (and its attempt) unless a task
        still needs it."""
        self.backups.discard(key)
        self._release_wanted(backup_key(key), "deepx-backup-dropped")

    def _release_wanted(self, key, why: str) -> None:
        if key in self.scheduler.tasks and CLIENT in self.scheduler.clients:
            self.scheduler.client_releases_keys([key], CLIENT, stimulus_id=f"{why}-{time.time()}")

    def _later(self, fn, *args) -> None:
        """Run `fn(*args)` once the scheduler has finished the transitions now under way
        (a plugin hook must not start transitions of its own)."""
        import asyncio
        asyncio.get_running_loop().call_soon(fn, *args)

    def _drift(self, run_id: str, drift: Drift) -> None:
        ts = self.scheduler.tasks.get(drift.key)
        if ts is None or ts.state != "processing" or ts.processing_on is None \
                or ts.processing_on.address != drift.worker:
            return
        self._note(run_id, "drift", drift.worker, drift.key, drift.reason)
        recorder = self.scheduler.plugins.get("deepx-recorder")
        if recorder is not None:
            recorder.attempt_ended(drift.key, drift.worker, drift.since, "drifted",
                                   f"TimeoutError: {drift.reason}")
        self._restrict(run_id, ts, drift.avoid)
        self._annotate(drift.key, "deepx_drifts", 1)
        # Released on its worker (which drops the attempt), then run again, since it is
        # still wanted.
        self.scheduler.transitions({drift.key: "released"},
                                   stimulus_id=f"deepx-drift-{time.time()}")

    def _exclude(self, run_id: str, exclude: Exclude) -> None:
        self._note(run_id, "exclude", exclude.worker, None, exclude.reason)
        names = self.names.get(run_id, ())
        avoid = set(self.watches[run_id].excluded)
        excluded = self.scheduler.workers.get(exclude.worker)
        again = []
        for key, ts in self.scheduler.tasks.items():
            if key_name(key) not in names or ts.state not in UNFINISHED:
                continue
            if ts.state == "processing":
                # One it runs finishes (or gets a backup) where it is; one it has not
                # started, waiting behind its other work, is given to another worker.
                if ts.processing_on is not excluded or excluded is None \
                        or ts in excluded.executing or not self._restrict(run_id, ts, avoid):
                    continue
                again.append(key)
                continue
            self._restrict(run_id, ts, avoid)
            if ts.state == "queued":
                again.append(key)  # queued tasks must be unrestricted: queue them again
        if again:
            self.scheduler.transitions({k: "released" for k in again},
                                       stimulus_id=f"deepx-exclude-{time.time()}")

    def _move_off(self, worker: str, keep) -> None:
        """Watched runs' tasks sent to a worker whose device is lost (all but `keep`, whose
        failure Dask is handling): released there and run elsewhere. They would fail on the
        broken device, and the worker starts them only once it has dealt with the failure,
        which can take Dask a good part of a second."""
        ws = self.scheduler.workers.get(worker)
        if ws is None:
            return
        moved = []
        for ts in list(ws.processing):
            run_id = self.run_of.get(key_name(ts.key))
            if ts.key != keep and run_id in self.watches \
                    and self._restrict(run_id, ts, self.watches[run_id].excluded):
                moved.append(ts.key)
        if moved:
            self.scheduler.transitions({k: "released" for k in moved},
                                       stimulus_id=f"deepx-device-lost-{time.time()}")

    def _restrict(self, run_id: str, ts, avoid) -> bool:
        """Restrict a task to the workers not in `avoid`; False where there are none."""
        allowed = {w for w in self.scheduler.workers if w not in avoid}
        if not allowed:
            return False  # nowhere else to go: leave it to run where it can
        ts.worker_restrictions = allowed
        ts.loose_restrictions = False
        self.restricted.setdefault(run_id, set()).add(ts.key)
        return True

    def _restricted_unfinished(self):
        """(run id, task) for each task we restricted that is not finished yet; the finished
        ones are forgotten on the way."""
        for run_id, keys in self.restricted.items():
            for key in list(keys):
                ts = self.scheduler.tasks.get(key)
                if ts is None or ts.state not in UNFINISHED:
                    keys.discard(key)
                else:
                    yield run_id, ts

    def _loosen_stranded(self) -> None:
        """Restricted tasks none of whose workers is left may run anywhere: the run goes on
        on the workers it has (Dask has already made those without a worker wait)."""
        workers, stranded = self.scheduler.workers, []
        for _, ts in self._restricted_unfinished():
            if ts.worker_restrictions is not None and \
                    not any(w in workers for w in ts.worker_restrictions):
                ts.loose_restrictions = True
                if ts.state == "no-worker":
                    stranded.append(ts.key)
        if stranded:  # released, then scheduled again, now anywhere
            self.scheduler.transitions({k: "released" for k in stranded},
                                       stimulus_id=f"deepx-loosen-{time.time()}")

    def _fail(self, keys, error: Exception) -> None:
        from distributed.core import error_message
        stimulus_id = f"deepx-fail-{time.time()}"
        msg = error_message(error)
        for key in keys:
            ts = self.scheduler.tasks.get(key)
            if ts is None or ts.state not in ("no-worker", "queued", "processing"):
                continue  # waiting and released tasks fail with what they wait for
            holder = ts.processing_on.address if ts.processing_on is not None else None
            fields = dict(cause=key, exception=msg["exception"], traceback=msg["traceback"],
                          exception_text=msg["exception_text"],
                          traceback_text=msg["traceback_text"])
            if ts.state == "processing":  # only that transition takes the worker
                fields["worker"] = holder
            recs, client_msgs, worker_msgs = self.scheduler._transition(
                key, "erred", stimulus_id, **fields)
            if holder is not None:  # drop the attempt still running there
                worker_msgs.setdefault(holder, []).append(
                    {"op": "free-keys", "keys": [key], "stimulus_id": stimulus_id})
            self.scheduler._transitions(recs, client_msgs, worker_msgs, stimulus_id)
            self.scheduler.send_all(client_msgs, worker_msgs)

    # -- reading lost chunks back from storage ----------------------------------------------

    def _stored(self, run_id: str, write_key, took) -> None:
        """A task storing chunks finished: they can be read back; it measured storage."""
        self.written.add(write_key)
        ts = self.scheduler.tasks.get(write_key)
        if ts is not None and took is not None:
            self.store_rates[run_id].add(sum(max(0, d.nbytes) for d in ts.dependencies), took)

    def _read_back_lost(self, run_id: str, key) -> None:
        """`key` was released: if it will be computed again, read the stored chunks of its
        lost lineage back where that is cheaper."""
        tasks = self.scheduler.tasks
        ts = tasks.get(key)
        if ts is None or not ts.run_spec or not (ts.who_wants or ts.waiters):
            return  # not needed again
        if key in self.written:  # a finished write's result: the chunk is stored already
            self._rewrite(ts, task(key, nothing_to_write))
            return
        table, watch, rate = self.readable[run_id], self.watches[run_id], \
            self.store_rates[run_id]

        def dependencies(k):
            t = tasks.get(k)
            return [d.key for d in t.dependencies] if t is not None else ()

        def held(k):  # a forgotten key is not ours to recompute
            t = tasks.get(k)
            return t is None or bool(t.who_has)

        def readable(k):
            stored, t = table.get(k), tasks.get(k)
            return stored is not None and t is not None and t.state == "released" \
                and all(w in self.written for w in stored.writes)

        for choice in decide(key, dependencies, held, readable, watch.expected,
                             lambda k: rate.read_seconds(max(0, tasks[k].nbytes))):
            self._note(run_id, "read-back" if choice.read else "recompute", None, choice.key,
                       choice.reason)
            if choice.read:
                stored = table[choice.key]
                self._rewrite(tasks[choice.key],
                              task(choice.key, load_region, stored.path, stored.region))

    def _rewrite(self, ts, run_spec) -> None:
        """Make released task `ts` run `run_spec`, which needs no other task: Dask then runs
        it instead of its lineage."""
        for dts in ts.dependencies:
            dts.dependents.discard(ts)
            if dts.waiters:
                dts.waiters.discard(ts)
            if not dts.dependents:
                self.orphans.add(dts.key)
        ts.dependencies = set()
        ts.waiting_on = None
        ts.has_lost_dependencies = False
        ts.run_spec = run_spec

    def _annotate(self, key, name: str, step: int) -> None:
        ts = self.scheduler.tasks.get(key)
        if ts is not None:
            # A new dict: the message that sent the old one to a worker may not be out yet.
            annotations = dict(ts.annotations or {})
            annotations[name] = annotations.get(name, 0) + step
            ts.annotations = annotations

    def _note(self, run_id: str, kind: str, worker, key, message: str) -> None:
        self.events.setdefault(run_id, []).append(
            (time.time(), kind, worker, None if key is None else str(key), message))


# -- run on the scheduler through client.run_on_scheduler ------------------------------------

def watch(dask_scheduler, run_id, names, policies, exclude_after, worker_wait,
          readable=None) -> bool:
    """Start watching a run; False when the supervisor is not installed yet."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None:
        return False
    plugin.watch(run_id, names, policies, exclude_after, worker_wait, readable)
    return True


def forget(dask_scheduler, run_id) -> None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is not None:
        plugin.forget(run_id)


def progress(dask_scheduler, run_id) -> tuple[int, int]:
    """How many of the run's tasks have finished, and the bytes of their results."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    finished = plugin.finished.get(run_id, {}) if plugin is not None else {}
    return len(finished), sum(finished.values())
