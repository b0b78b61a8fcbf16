"""The scheduler side of run recording: a Dask scheduler plugin that notes, for the keys of
the runs it is told about, every finished or failed task and where each chunk is held.

It only buffers; the process that started a run drains the buffer (`drain`, through
`client.run_on_scheduler`) and writes it to the metadata database. So the scheduler needs no
database access, a remote cluster works like a local one, and the scheduler's event loop
never waits for a disk.

Where chunks are comes from the scheduler's own state, so it agrees with `who_has`:
- a task finishing puts its chunk on the worker that computed it ("memory"): every finished
  task has its placement row, also one whose chunk was dropped before the next drain;
- copies made by transfers are found at each drain by comparing `who_has` with what was
  last reported (new holders "memory", dropped ones "released");
- a key leaving memory marks its holders "released", or "lost" when the holder is a worker
  that has just left the cluster;
- workers report chunks they spilled to disk (and read back) as events (`SpillReporter`).

Every attempt of a task gets a row: a failed attempt that Dask retries is "retried" (its
error comes from the task wrapper's report, `kernels/attempt.py`), one the supervisor
abandoned after its time limit is "drifted", the last is "memory" or "erred". The
supervisor's events (drifts, excluded workers, lost devices) are drained with the run's own.

A task's attempt belongs to the run it is computed for: the run tracking its key when it
is given to the scheduler (it enters a state of `GOING`), until it leaves those states
(finished, failed, or let go). The plugin counts each run's tasks in flight, so that its
driver ends the run only once none is left (`drain(final=True, land_s=...)` waits for them):
a run's end comes after every task of it, also those computed after its outputs (a
training's graph is done when its losses are back, while the tasks taking out its parameters
may still run).

A run is going from `track` until its driver's final drain. A worker that leaves the
cluster is a "worker-lost" event of every run going then, and of every run whose chunks it
held. Records of runs that have ended (a persisted chunk released or lost later, a task
still running when a failed run was ended, a lost chunk computed again) are handed to
whichever driver recording in the same database drains next, so they are written even if
nobody looks at that run again: the plugin keeps where each run is recorded, and what its
tasks run (one copy for all the runs of a graph), for as long as it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from deepx_flow.ir.keys import key_name
from deepx_flow.kernels.attempt import ATTEMPT_TOPIC

PLUGIN_NAME = "deepx-recorder"
# The records a drain returns are tuples in these orders. Keys stay Dask keys: turning them
# into text is left to the driver, since scheduler CPU is what every task waits on.
TASK_FIELDS = ("key", "worker", "start", "stop", "bytes_in", "bytes_out", "attempts",
               "status", "error", "comm_seconds")
PLACEMENT_FIELDS = ("key", "worker", "state", "nbytes", "at")
EVENT_FIELDS = ("at", "kind", "worker", "key", "message")
SPILL_TOPIC = "deepx-spill"
# How long a drain waits for the scheduler to process a client's release of keys.
SETTLE_TIMEOUT_S = 5.0
SETTLE_POLL_S = 0.001
# The states of a task given to the scheduler and not yet finished, failed or let go.
GOING = frozenset({"waiting", "queued", "no-worker", "processing"})


class RecorderPlugin(SchedulerPlugin):
    """Buffers task and placement records of tracked runs until their driver drains them."""

    name = PLUGIN_NAME
    idempotent = True  # registering it again keeps the one with its buffers

    def __init__(self):
        self.scheduler = None
        self.run_of: dict[str, str] = {}  # key name -> run id (the latest run to track it)
        self.attempts: dict = defaultdict(int)
        self.failed: dict = {}  # key -> (worker, start, stop, error) of its last failed attempt
        self.tasks: dict[str, list] = defaultdict(list)
        # run -> {(key, worker): latest placement}: every chunk a task made is written, also
        # one made and dropped between two drains (as released, with its size).
        self.placements: dict[str, dict] = defaultdict(dict)
        self.events: dict[str, list] = defaultdict(list)
        self.holders: dict = {}  # key -> set of workers last reported holding it
        # key -> the run that computed the chunk held now: its later copies, release or
        # loss belong to that run, even if a later run tracked the same (content) key.
        self.owner: dict = {}
        self.lost_runs: dict = defaultdict(set)  # dead worker -> runs that lost chunks on it
        # Runs whose driver has not drained them for the last time: they are going, so a
        # worker lost now is lost to them. What is buffered for any other run (a persisted
        # chunk released or lost after its run ended) goes with whichever drain comes next.
        self.active: set = set()
        # run -> the database its driver records it in (`Database.identity`): one cluster
        # may serve drivers writing different databases, and records go to their own.
        self.store_of: dict[str, str] = {}
        # run -> what its tasks run, by node id (the driver's operator labels): the records
        # of a run that has ended are written by whichever driver drains next, which may
        # have started other runs, of other graphs. Both are kept after the run ends: a
        # chunk of it may be computed again later. Equal label tables are one object
        # (`_shared`): the runs of one graph (a training's graphs of steps) share it.
        self.labels_of: dict[str, dict] = {}
        self._shared: dict = {}
        self.client_of: dict[str, str] = {}  # run -> the client of the driver recording it
        self.flying: dict = {}  # key in a state of GOING -> the run it is computed for
        self.unlanded: dict[str, int] = {}  # run -> how many of its tasks are in flight
        self.landed: dict[str, asyncio.Event] = {}  # run -> set once none is (drains wait)
        self.hook_seconds = 0.0  # CPU seconds in `transition` for tracked keys (benchmarks)

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    # -- called by the driver through run_on_scheduler ---------------------------------------

    def begin_run(self, run_id: str, names, store: str, client: str | None = None,
                  labels: dict | None = None) -> None:
        """A driver (its Dask client `client`) starts run `run_id` of the keys named
        `names`, recorded in `store`; `labels` names what its tasks run, by node id."""
        self.track(run_id, names)
        self.active.add(run_id)
        self.store_of[run_id] = self._shared.setdefault(store, store)
        labels = labels or {}
        self.labels_of[run_id] = self._shared.setdefault(tuple(sorted(labels.items())), labels)
        if client is not None:
            self.client_of[run_id] = client

    def remove_client(self, scheduler, client: str, **kwargs) -> None:
        """A driver's client left: its runs are over (it cannot drain them any more), and
        their records have no one to go to."""
        gone = [r for r, c in self.client_of.items() if c == client]
        for run_id in gone:
            del self.client_of[run_id]
            self.active.discard(run_id)

    def track(self, run_id: str, names) -> None:
        for name in names:
            self.run_of[name] = run_id

    def add_tasks(self, run_id: str, names, labels: dict) -> None:
        """Tasks named `names` that the driver of run `run_id` submits besides its graph
        (the writes of its chunks) are its too; `labels` names what they run."""
        self.track(run_id, names)
        merged = {**self.labels_of.get(run_id, {}), **labels}
        self.labels_of[run_id] = self._shared.setdefault(tuple(sorted(merged.items())), merged)

    async def drain(self, run_ids, settle_keys=(), client_id: str | None = None,
                    final: bool = False, store: str | None = None, land_s: float = 0.0,
                    force: bool = False) -> dict:
        """Pop everything buffered for `run_ids`, and for runs recorded in `store` that were
        already drained for the last time (with their `labels`), by run id; each of
        `run_ids` says how many of its tasks are still in flight (`going`). With
        `settle_keys`, first wait (bounded) until the scheduler has processed `client_id`'s
        release of them, so the drain sees them released.

        `final`: the driver ends `run_ids`: first wait up to `land_s` seconds for their
        tasks in flight to finish; a run with none left (or any, with `force`) has ended
        (`ended`: this was its last drain); the others are drained again later."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while settle_keys and time.monotonic() < deadline and any(
                self._wanted_by(k, client_id) for k in settle_keys):
            # The release comes on the client's batched stream, usually within a few ms of
            # this call: a small run's driver waits for its last drain on this loop.
            await asyncio.sleep(SETTLE_POLL_S)
        if final and not force and land_s > 0:
            await self._landing(run_ids, land_s)
        self._sync_replicas()
        supervisor = self.scheduler.plugins.get("deepx-supervisor")
        ended = {r for r in (*self.tasks, *self.placements, *self.events)
                 if r not in self.active and store is not None
                 and self.store_of.get(r) == store}
        out = {}
        for run_id in [*run_ids, *sorted(ended - set(run_ids))]:
            events = self.events.pop(run_id, [])
            if supervisor is not None and run_id in run_ids:
                events += supervisor.pop_events(run_id)
            out[run_id] = {"tasks": self.tasks.pop(run_id, []),
                           "placements": list(self.placements.pop(run_id, {}).values()),
                           "events": sorted(events, key=lambda e: e[0])}
            if run_id not in run_ids:
                out[run_id]["labels"] = self.labels_of.get(run_id, {})
        for run_id in run_ids:
            going = self.unlanded.get(run_id, 0)
            out[run_id]["going"] = going
            out[run_id]["ended"] = final and (force or not going)
            if out[run_id]["ended"]:
                self.active.discard(run_id)
                self.client_of.pop(run_id, None)
        return out

    async def _landing(self, run_ids, timeout: float) -> None:
        """Wait until none of `run_ids` has a task in flight, or `timeout` seconds."""
        waits = [self.landed.setdefault(r, asyncio.Event()).wait()
                 for r in run_ids if self.unlanded.get(r)]
        if waits:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout)

    def attempt_ended(self, key, worker, start, status: str, error: str) -> None:
        """Record an attempt that ended without Dask knowing: drifted (abandoned after its
        timeout) or superseded (a backup attempt finished first, or its backup was not
        needed)."""
        run_id = self.flying.get(key, self.run_of.get(key_name(key)))
        if run_id is not None:
            self.tasks[run_id].append((key, worker, start, time.time(), None, None,
                                       max(1, self.attempts.get(key, 1)), status, error,
                                       None))

    def _wanted_by(self, key, client_id) -> bool:
        ts = self.scheduler.tasks.get(key)
        return ts is not None and any(cs.client_key == client_id for cs in ts.who_wants)

    # -- scheduler hooks ----------------------------------------------------------------------

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs) -> None:
        run_id = self.run_of.get(key_name(key))
        if run_id is None:
            return
        began = time.thread_time()  # CPU time: waiting for the GIL is not the hook's cost
        self._transition(run_id, key, start, finish, kwargs)
        self.hook_seconds += time.thread_time() - began

    def _transition(self, run_id, key, start, finish, kwargs) -> None:
        going = finish in GOING
        if going != (start in GOING):  # given to the scheduler, or done with
            run_id = self._take_off(key, run_id) if going else self._land(key, run_id)
        if finish == "processing":
            self.attempts[key] += 1
        elif start == "processing" and finish in ("memory", "erred"):
            self._task_done(run_id, key, finish, kwargs)
        elif start == "processing" and key in self.failed:
            # The attempt failed and Dask retries it (processing -> released -> waiting).
            worker, began, ended, error = self.failed.pop(key)
            self.tasks[run_id].append((key, worker, began, ended, None, None,
                                       max(1, self.attempts.get(key, 1)), "retried", error,
                                       None))
        if finish == "memory" and start != "memory":
            worker = kwargs.get("worker")
            ts = self.scheduler.tasks.get(key)
            workers = {worker} if worker else {ws.address for ws in ts.who_has or ()}
            for w in workers:
                self._place(run_id, key, w, "memory", kwargs.get("nbytes")
                            or (ts.nbytes if ts else None))
            self.holders[key] = workers
            self.owner[key] = run_id
        elif start == "memory" and finish != "memory":
            alive = self.scheduler.workers
            run_id = self.owner.pop(key, run_id)
            for w in self.holders.pop(key, ()):
                if w in alive:
                    self._place(run_id, key, w, "released", None)
                else:  # the scheduler drops a dead worker's keys before telling plugins
                    self._place(run_id, key, w, "lost", None)
                    self.lost_runs[w].add(run_id)
        if finish == "forgotten":
            self.attempts.pop(key, None)
            self.failed.pop(key, None)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id=None, **kwargs) -> None:
        # Every run going now lost the worker, whether or not it held one of their chunks at
        # this moment (it may have been computing their tasks); so did every run whose
        # chunks it held.
        now = time.time()
        runs = self.lost_runs.pop(worker, set()) | self.active
        for key, workers in list(self.holders.items()):
            if worker in workers:
                workers.discard(worker)
                run_id = self.owner.get(key)
                self._place(run_id, key, worker, "lost", None)
                runs.add(run_id)
        runs.discard(None)
        for run_id in sorted(runs):
            self.events[run_id].append((now, "worker-lost", worker, None,
                                        f"worker {worker} left the cluster ({stimulus_id})"))

    def log_event(self, topic, msg) -> None:
        if topic == ATTEMPT_TOPIC and isinstance(msg, dict):
            key = tuple(msg["key"]) if isinstance(msg["key"], list) else msg["key"]
            if key_name(key) in self.run_of:
                self.failed[key] = (msg["worker"], msg["start"], msg["stop"], msg["error"])
            return
        if topic != SPILL_TOPIC or not isinstance(msg, dict):
            return
        worker = msg.get("worker")
        for state, keys in (("spilled", msg.get("spilled", ())),
                            ("memory", msg.get("unspilled", ()))):
            for key in keys:
                key = tuple(key) if isinstance(key, list) else key
                run_id = self.owner.get(key)
                if run_id is not None and worker in self.holders.get(key, ()):
                    ts = self.scheduler.tasks.get(key)
                    self._place(run_id, key, worker, state, ts.nbytes if ts else None)

    # -- internals ----------------------------------------------------------------------------

    def _take_off(self, key, run_id: str) -> str:
        """`key` is to be computed, for `run_id`: in flight until it lands."""
        if key in self.flying:  # not expected: count it once
            self._land(key, run_id)
        self.flying[key] = run_id
        self.unlanded[run_id] = self.unlanded.get(run_id, 0) + 1
        return run_id

    def _land(self, key, run_id: str) -> str:
        """`key` is done with (finished, failed or let go): the run it was computed for."""
        flew = self.flying.pop(key, None)
        if flew is None:  # in flight before its run was tracked
            return run_id
        left = self.unlanded[flew] - 1
        if left:
            self.unlanded[flew] = left
        else:
            del self.unlanded[flew]
            waiting = self.landed.pop(flew, None)
            if waiting is not None:
                waiting.set()
        return flew

    def _task_done(self, run_id, key, finish, kw) -> None:
        startstops = this_attempt(kw.get("startstops") or ())
        compute = [s for s in startstops if s.get("action") == "compute"]
        # The worker reports each input it fetched from another worker as a "transfer".
        fetched = [s["stop"] - s["start"] for s in startstops if s.get("action") == "transfer"]
        failed = self.failed.pop(key, None)
        if not compute and failed is not None:
            compute = [{"start": failed[1], "stop": failed[2]}]
        ts = self.scheduler.tasks.get(key)
        deps_bytes = sum(max(d.nbytes, 0) for d in ts.dependencies) if ts else None
        # A tuple in TASK_FIELDS order: drains move thousands of these.
        self.tasks[run_id].append((
            key, kw.get("worker"),
            compute[0]["start"] if compute else None,
            compute[-1]["stop"] if compute else None,
            deps_bytes,
            kw.get("nbytes") if finish == "memory" else None,
            max(1, self.attempts.get(key, 1)),
            finish,
            kw.get("exception_text") if finish == "erred" else None,
            sum(fetched) if fetched else 0.0))

    def _place(self, run_id, key, worker, state, nbytes) -> None:
        if run_id is None:
            return
        rows = self.placements[run_id]
        if nbytes is None and (key, worker) in rows:  # released or lost: keep its size
            nbytes = rows[(key, worker)][3]
        rows[(key, worker)] = (key, worker, state, nbytes, time.time())

    def _sync_replicas(self) -> None:
        """Record copies that transfers made (or dropped) since the last drain."""
        tasks = self.scheduler.tasks
        for key, known in list(self.holders.items()):
            run_id = self.owner.get(key)
            ts = tasks.get(key)
            if ts is None or ts.state != "memory":
                continue
            now = {ws.address for ws in ts.who_has or ()}
            if now == known:
                continue
            for w in now - known:
                self._place(run_id, key, w, "memory", ts.nbytes)
            for w in known - now:
                self._place(run_id, key, w, "released", None)
            self.holders[key] = now


def this_attempt(startstops) -> list:
    """The entries of a finished task's `startstops` that belong to the attempt that just
    finished: those after the computation before it. A worker keeps a key's state (and that
    list) while it holds the key, and appends every computation of it: a key that a later
    graph computes again on that worker (the constant learning rate every graph of a
    `dx.train` reads) lists the earlier ones too, whose span is not this attempt's work."""
    computed = [i for i, s in enumerate(startstops) if s.get("action") == "compute"]
    return list(startstops[computed[-2] + 1:] if len(computed) > 1 else startstops)


async def drain(dask_scheduler, run_ids, settle_keys=(), client_id=None, final=False,
                store=None, land_s=0.0, force=False) -> dict:
    """Run on the scheduler: the recorder plugin's buffered records for `run_ids` (and for
    runs in `store` that have ended), by run id (see `RecorderPlugin.drain`)."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None:
        return {run_id: {"tasks": [], "placements": [], "events": [], "going": 0,
                         "ended": final} for run_id in run_ids}
    return await plugin.drain(run_ids, settle_keys, client_id, final, store, land_s, force)


def hook_seconds(dask_scheduler) -> float:
    """Run on the scheduler: CPU seconds the recorder's transition hook has taken so far."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    return plugin.hook_seconds if plugin is not None else 0.0


def add_tasks(dask_scheduler, run_id, names, labels) -> None:
    """Run on the scheduler: `RecorderPlugin.add_tasks`."""
    dask_scheduler.plugins[PLUGIN_NAME].add_tasks(run_id, names, labels)


def track(dask_scheduler, run_id, names, store, client=None, labels=None) -> None:
    """Run on the scheduler, where the plugin is installed (`begin.begin` checks): a run
    starts, recorded in `store` by the driver whose client is `client`; record the keys named
    `names` under `run_id` (`labels`: what its tasks run, by node id)."""
    dask_scheduler.plugins[PLUGIN_NAME].begin_run(run_id, names, store, client, labels)


class SpillReporter(WorkerPlugin):
    """On each worker: every second, report keys moved to or from the disk since the last
    look, as an event the scheduler plugin turns into "spilled" / "memory" placements."""

    name = "deepx-spill-reporter"
    idempotent = True
    INTERVAL_MS = 1000

    def setup(self, worker) -> None:
        from tornado.ioloop import PeriodicCallback

        self.worker = worker
        self.spilled: set = set()
        self.callback = PeriodicCallback(self._look, self.INTERVAL_MS)
        self.callback.start()

    def teardown(self, worker) -> None:
        self.callback.stop()

    def _look(self) -> None:
        slow = getattr(self.worker.data, "slow", None)
        if slow is None:
            return
        now = set(slow.keys())
        spilled, unspilled = now - self.spilled, self.spilled - now
        self.spilled = now
        if spilled or unspilled:
            self.worker.log_event(SPILL_TOPIC, {
                "worker": self.worker.address, "spilled": list(spilled),
                "unspilled": [k for k in unspilled if k in self.worker.data]})
