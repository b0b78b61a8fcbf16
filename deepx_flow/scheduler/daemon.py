"""The `deepx-flow scheduler` daemon: a thin shell around the pure tick decisions
(`ticks.py`), the tick rows (`records.py`) and `dx.materialize`.

The main loop never waits on a run. Each pass asks `decide_ticks` what is due, appends the
decisions to the schedule's lane, and records the skips at the head of it; the lane's
worker thread claims each launched tick (inserts its row) when it reaches the head,
materializes the selection on the daemon's one Dask client, and writes the outcome, one
run at a time. So ticks keep being evaluated, and the heartbeat keeps beating, while runs
go.

State, and the rules that make every decided tick run once or be recorded, never run twice:
- `cursor`: per schedule, the newest tick decided. A (re)started daemon takes the newest
  recorded tick, or the time the schedule was first seen as it is now, whichever is later;
- a lane's ticks get their rows in tick order (`ticks.Backlog`): a skip decided while an
  older launched tick waits to be claimed is recorded only after that claim. So no row of
  this daemon ever passes a tick it decided and has not written, and a tick without a row
  when the daemon stops or dies lies after the newest recorded one: the next life decides
  it again;
- a launched tick is claimed when its run starts, not when it is decided, and a tick that
  has a row is never started again, by any daemon;
- on start, ticks claimed by a daemon that is gone (`liveness.py`) are closed as failed
  and not relaunched: their run may have stored its assets before the daemon died;
- on stop (SIGTERM, SIGINT, or the end of `--once`), the lanes' unwritten ticks (queued
  launches, skips behind them) are dropped, runs that are going get `STOP_GRACE_S` to
  finish, and a run still going then has its row closed as failed (a second signal stops
  without waiting). The schedules then record the stop (`stopped_at`), so the dashboard
  says "stopped" at once instead of "alive" until the heartbeat goes stale.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
import time

from deepx_flow.errors import DatabaseError
from deepx_flow.scheduler import records
from deepx_flow.scheduler.liveness import daemon_gone
from deepx_flow.scheduler.ticks import (MAX_QUEUED, Backlog, Decision, decide_ticks,
                                        format_tick, next_tick)

POLL_S = 0.2  # longest sleep between passes: per-second crons, clock jumps, signals
HEARTBEAT_S = 5.0
STOP_GRACE_S = 30.0


class _Lane:
    """One schedule's decided ticks without a row (`backlog`), and its worker thread, which
    claims and runs the launched ones, one at a time, in tick order."""

    def __init__(self, daemon: SchedulerDaemon, schedule):
        self.daemon, self.schedule = daemon, schedule
        # Guards backlog, running and current, and is held while a backlog row is written.
        self.lock = threading.Condition()
        self.backlog = Backlog()
        self.running = False  # a claimed tick's run is going
        self.current: int | None = None  # the row of that tick, until its outcome is taken
        self.thread = threading.Thread(target=self._work, daemon=True,
                                       name=f"deepx-schedule-{schedule.name}")
        self.thread.start()

    @property
    def waiting(self) -> int:
        """Runs of this schedule going or waiting to be claimed."""
        with self.lock:
            return self.backlog.launches + self.running

    @property
    def busy(self) -> bool:
        with self.lock:
            return self.running or bool(self.backlog)

    def add(self, decisions: list[Decision]) -> None:
        with self.lock:
            self.backlog.add(decisions)
            self.lock.notify_all()

    def write_skips(self) -> None:
        """Record the skips at the head of the backlog (none passes a launch not claimed)."""
        with self.lock:
            while (d := self.backlog.head()) is not None and not d.launch:
                self.daemon._record_skip(self.schedule, d)
                self.backlog.pop()
                self.lock.notify_all()  # a launch may be at the head now

    def drop_waiting(self) -> None:
        with self.lock:
            self.backlog.drop()
            self.lock.notify_all()

    def close(self, tick_id: int) -> bool:
        """Take the row of the run going, if it is still `tick_id`: whoever takes it first
        (the run's end, or a stop that stopped waiting for it) writes its outcome."""
        with self.lock:
            if self.current != tick_id:
                return False
            self.current = None
            return True

    def _claim_head(self) -> tuple[float, int | None] | None:
        """Wait until the head is a launch, claim it: (its tick, its row or None when it was
        taken). None when the daemon stops."""
        stopping = self.daemon.stopping
        with self.lock:  # every change to the backlog, and a stop, notifies
            self.lock.wait_for(lambda: stopping.is_set() or self._launch_first())
            if stopping.is_set():
                return None
            d = self.backlog.head()
            tick_id = self.daemon._claim(self.schedule, d.tick_at)  # may raise: head stays
            self.backlog.pop()
            self.running, self.current = tick_id is not None, tick_id
            self.lock.notify_all()
            return d.tick_at, tick_id

    def _launch_first(self) -> bool:
        d = self.backlog.head()
        return d is not None and d.launch

    def _work(self) -> None:
        while True:
            try:
                claimed = self._claim_head()
            except DatabaseError as err:  # the database went away: the tick stays, try again
                self.daemon.say(f"{self.schedule.name}: {_one_line(err)}; trying again in "
                                f"{HEARTBEAT_S:.0f} s")
                self.daemon.stopping.wait(HEARTBEAT_S)
                continue
            if claimed is None:
                return
            tick_at, tick_id = claimed
            try:
                if tick_id is not None:
                    self.daemon._run_tick(self, tick_at, tick_id)
            except Exception as err:  # noqa: BLE001 (the outcome could not be written)
                self.daemon.say(f"{self.schedule.name}: tick at {format_tick(tick_at)}: "
                                f"{_one_line(err)}")
            finally:
                with self.lock:
                    self.running = False
                    self.lock.notify_all()


class SchedulerDaemon:
    """Runs the schedules of one `Definitions` on one Dask client, recording each tick."""

    def __init__(self, defs, db, client, *, definitions: str = "", out=None,
                 clock=time.time, max_queued: int = MAX_QUEUED):
        self.defs, self.db, self.client = defs, db, client
        self.max_queued = max_queued  # per schedule, with catchup="all"
        self.definitions = definitions  # where the schedules came from, for the rows
        self.out = out or sys.stdout
        self.clock = clock
        self.host = socket.gethostname()
        self.me = f"{self.host}:{os.getpid()}"
        self.schedules = {s.name: s for s in defs.schedules}
        self.cursor: dict[str, float] = {}
        self.lanes: dict[str, _Lane] = {}
        self.stopping = threading.Event()
        self.failed = 0  # ticks whose run failed in this life
        self.awake_since: float | None = None
        self._beat_at = -math.inf
        self._print_lock = threading.Lock()

    # --- life --------------------------------------------------------------------------

    def start(self) -> None:
        """Close abandoned ticks, write the schedule rows, set the cursors, start lanes."""
        now = self.clock()
        self._close_abandoned(now)
        seen = records.sync_schedules(self.db, self.schedules.values(),
                                      definitions=self.definitions, daemon=self.me, now=now)
        last = records.last_ticks(self.db, self.schedules)
        self._beat_at = now
        self.awake_since = now
        for name, s in self.schedules.items():
            self.cursor[name] = max(last.get(name, -math.inf), seen[name])
            self.lanes[name] = _Lane(self, s)
            self.say(f"{name}: {s.cron} ({s.timezone}) materializes {s.selection!r}, "
                     f"catchup={s.catchup}; next tick "
                     f"{format_tick(next_tick(s, self.cursor[name]), s.timezone)}")

    def serve(self, stop: threading.Event) -> None:
        """Evaluate ticks until `stop` is set."""
        while not stop.is_set():
            try:
                now = self.clock()
                self.evaluate(now)
                if now - self._beat_at >= HEARTBEAT_S:
                    records.heartbeat(self.db, self.schedules, daemon=self.me, now=now)
                    self._beat_at = now
            except DatabaseError as err:  # decided ticks stay in the lanes: try again later
                self.say(f"{_one_line(err)}; trying again in {HEARTBEAT_S:.0f} s")
                stop.wait(HEARTBEAT_S)
                continue
            stop.wait(min(max(self.next_due() - self.clock(), 0.0), POLL_S))

    def evaluate(self, now: float) -> None:
        """Decide the due ticks of every schedule and hand them to its lane; record the
        skips that no unclaimed launch comes before (the rest when their turn comes)."""
        for name, s in self.schedules.items():
            lane = self.lanes[name]
            decisions = decide_ticks(s, self.cursor[name], now, waiting=lane.waiting,
                                     awake_since=self.awake_since,
                                     max_queued=self.max_queued)
            if decisions:
                lane.add(decisions)
                self.cursor[name] = decisions[-1].tick_at
            lane.write_skips()  # a DatabaseError leaves them there, for the next pass

    def next_due(self) -> float:
        return min((next_tick(s, self.cursor[name]) for name, s in self.schedules.items()),
                   default=math.inf)

    def drain(self, stop: threading.Event | None = None) -> None:
        """Wait until every decided tick has its row and no run is going (or `stop` is
        set), recording skips as the launches before them are claimed."""
        while any(lane.busy for lane in self.lanes.values()):
            if stop is not None and stop.is_set():
                return
            for lane in self.lanes.values():
                lane.write_skips()
            time.sleep(0.05)

    def shutdown(self, grace: float = STOP_GRACE_S, hurry: threading.Event | None = None,
                 why: str = ""):
        """Drop the ticks that have no row (the next daemon decides them again), give runs
        `grace` seconds, close the rows of those still going, and record on the schedules
        that this daemon stopped (`why`: what stopped it, for its last line)."""
        self.stopping.set()
        for lane in self.lanes.values():
            lane.drop_waiting()
        deadline = time.monotonic() + grace
        while any(lane.busy for lane in self.lanes.values()) and \
                time.monotonic() < deadline and not (hurry is not None and hurry.is_set()):
            time.sleep(0.05)
        for lane in self.lanes.values():
            tick_id = lane.current
            if tick_id is not None and lane.close(tick_id):
                message = f"the daemon {self.me} stopped during the run; not relaunched"
                records.finish(self.db, tick_id, status="failed", run_id=None,
                               message=message, now=self.clock())
                self.say(f"{lane.schedule.name}: {message}")
        try:
            records.stopped(self.db, self.schedules, daemon=self.me, now=self.clock())
        except DatabaseError as err:  # its heartbeat goes stale instead
            self.say(f"could not record the stop: {_one_line(err)}")
        self.say(f"scheduler {self.me} stopped" + (f" ({why})" if why else ""))

    # --- one tick ----------------------------------------------------------------------

    def _claim(self, s, tick_at: float) -> int | None:
        tick_id = records.claim(self.db, s.name, tick_at, daemon=self.me, now=self.clock())
        if tick_id is None:
            self._tick_line(s, tick_at, "taken", None, "already recorded by another daemon "
                                                       "or an earlier life of this one")
        return tick_id

    def _record_skip(self, s, d: Decision) -> None:
        if records.record_skip(self.db, s.name, d.tick_at, d.reason, daemon=self.me,
                               now=self.clock()):
            self._tick_line(s, d.tick_at, "skipped", None, d.reason)

    def _run_tick(self, lane: _Lane, tick_at: float, tick_id: int) -> None:
        from deepx_flow.assets.materialize import materialize

        s = lane.schedule
        try:
            result = materialize(self.defs, s.selection, only_stale=s.only_stale,
                                 client=self.client, db=self.db.url)
            status, run_id, message = "launched", result.run_id, _summary(result)
        except Exception as err:  # noqa: BLE001 (a run can fail any way: record it)
            stored = getattr(err, "materialized", None)  # CheckFailed says what it stored
            status, run_id, message = "failed", getattr(stored, "run_id", None), _one_line(err)
        if lane.close(tick_id):
            records.finish(self.db, tick_id, status=status, run_id=run_id, message=message,
                           now=self.clock())
            self.failed += status == "failed"
            self._tick_line(s, tick_at, status, run_id, message)

    def _close_abandoned(self, now: float) -> None:
        rows = records.schedule_rows(self.db, self.schedules)
        for tick in records.unfinished_ticks(self.db, self.schedules):
            row = rows.get(tick.schedule)
            same = row is not None and row.daemon == tick.daemon
            if daemon_gone(tick.daemon, me=self.me, host=self.host, pid_alive=_pid_alive,
                           heartbeat_at=row.heartbeat_at if same else None, now=now,
                           stopped=same and row.stopped_at is not None):
                message = f"the daemon {tick.daemon} stopped during the run; not relaunched"
                records.finish(self.db, tick.id, status="failed", run_id=None,
                               message=message, now=now)
                s = self.schedules[tick.schedule]
                self._tick_line(s, tick.tick_at, "failed", None, message)

    # --- output ------------------------------------------------------------------------

    def _tick_line(self, s, tick_at: float, status: str, run_id: str | None,
                   message: str) -> None:
        self.say(tick_line(s, tick_at, status, run_id, message))

    def say(self, line: str) -> None:
        with self._print_lock:
            print(line, file=self.out, flush=True)


def tick_line(s, tick_at: float, status: str, run_id: str | None, message: str) -> str:
    """The log line of one tick: time, schedule, status, run id, what happened."""
    run = f"run {run_id[:12]}" if run_id else "-"
    return f"{format_tick(tick_at, s.timezone)}  {s.name}  {status}  {run}  {message}"


def serve_until_signalled(daemon: SchedulerDaemon, once: bool = False) -> int:
    """Start `daemon`, serve until SIGTERM or SIGINT (or, with `once`, until the ticks due
    now have run), stop it. Exit code 1 when a run failed in `once` mode, else 0."""
    stop, hurry = threading.Event(), threading.Event()
    why = ["--once" if once else ""]

    def on_signal(signum, frame):
        if not stop.is_set():
            why[0] = signal.Signals(signum).name
        (hurry if stop.is_set() else stop).set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        daemon.start()
        if once:
            daemon.evaluate(daemon.clock())
            daemon.drain(stop)
        else:
            daemon.serve(stop)
    finally:
        daemon.shutdown(hurry=hurry, why=why[0])
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if once and daemon.failed else 0


def _summary(result) -> str:
    if not result.versions and not result.skipped:
        return "nothing to materialize"
    parts = []
    if result.versions:
        parts.append(f"materialized {', '.join(result.versions)} in {result.seconds:.1f} s")
    parts += [f"{name} not materialized: {why}" for name, why in result.skipped.items()]
    if len(result.run_ids) > 1:
        parts.append(f"runs {', '.join(r[:12] for r in result.run_ids)}")
    return "; ".join(parts)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _pid_alive(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
