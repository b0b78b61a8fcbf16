"""The daemon shell in this process, on a fake clock, with `dx.materialize` replaced by a
stub that counts runs: claims under two daemons, restarts, abandoned ticks, overlapping
runs, a full queue then a stop, and `--once`, on each database backend."""

from __future__ import annotations

import importlib
import io
import socket
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.meta.models import Schedule, ScheduleTick
from deepx_flow.scheduler.daemon import SchedulerDaemon, serve_until_signalled

T = 1_800_000_000.0  # a whole second, so per-second ticks are T + 1, T + 2, ...


@dx.asset
def doubled():
    return dx.ones((4, 4)) * 2


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeRuns:
    """Stands in for dx.materialize: one new run id per call. After `hold()`, the next call
    waits until `release()`."""

    def __init__(self):
        self.run_ids: list[str] = []
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None  # for the next call
        self.held = threading.Event()
        self.error: Exception | None = None  # raised by every call when set

    def hold(self) -> None:
        self.held = self.gate = threading.Event()

    def release(self) -> None:
        self.held.set()

    def __call__(self, defs, select, *, only_stale, client, db):
        with self.lock:
            gate, self.gate = self.gate, None
        if gate is not None:
            assert gate.wait(30)
        if self.error is not None:
            raise self.error
        run_id = uuid.uuid4().hex
        with self.lock:
            self.run_ids.append(run_id)
        return SimpleNamespace(run_id=run_id, run_ids=[run_id], versions={"doubled": None},
                               skipped={}, seconds=0.01)


@pytest.fixture
def runs(monkeypatch):
    fake = FakeRuns()
    # The module, not the package attribute: `deepx_flow.assets.materialize` is the function.
    monkeypatch.setattr(importlib.import_module("deepx_flow.assets.materialize"), "materialize",
                        fake)
    yield fake


def daemon(db, clock, catchup="all", me=None, **kwargs) -> SchedulerDaemon:
    defs = dx.Definitions(assets=[doubled], schedules=[
        dx.schedule("* * * * * *", "doubled", name="every_second", catchup=catchup)])
    d = SchedulerDaemon(defs, db, None, definitions="test", out=io.StringIO(), clock=clock,
                        **kwargs)
    if me:
        d.me = me
    return d


def ticks(db) -> list[ScheduleTick]:
    with db.read() as s:
        return list(s.exec(select(ScheduleTick).order_by(ScheduleTick.tick_at)))


def wait_for(condition, timeout=20.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_two_daemons_launch_each_tick_once(db, runs):
    clock = Clock(T)
    a, b = daemon(db, clock, me="a:1"), daemon(db, clock, me="b:2")
    a.start()
    b.start()
    clock.now = T + 5.5
    a.evaluate(clock.now)
    b.evaluate(clock.now)
    a.drain()
    b.drain()
    rows = ticks(db)
    assert [r.tick_at - T for r in rows] == [1, 2, 3, 4, 5]
    assert {r.status for r in rows} == {"launched"}
    assert sorted(r.run_id for r in rows) == sorted(runs.run_ids)  # one run per tick
    assert len(set(runs.run_ids)) == 5
    lines = a.out.getvalue() + b.out.getvalue()
    assert lines.count("  taken  ") == 5  # each daemon lost some claims, and said so


def test_a_restart_closes_the_abandoned_tick_and_catches_up_once(db, runs):
    clock = Clock(T)
    host = socket.gethostname()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    first = daemon(db, clock, catchup="latest", me=f"{host}:{proc.pid}")
    first.start()
    clock.now = T + 2.1
    first.evaluate(clock.now)  # T+1 skipped (came with T+2), T+2 launched
    first.drain()
    gate = threading.Event()
    runs.gate = gate  # never opened while the test looks
    clock.now = T + 3.1
    first.evaluate(clock.now)  # T+3 launched; its run hangs, then the daemon "dies"
    wait_for(lambda: len(ticks(db)) == 3)
    first.lanes["every_second"].current = None  # a dead daemon writes nothing more

    clock.now = T + 7.5
    second = daemon(db, clock, catchup="latest")
    second.start()
    second.evaluate(clock.now)
    second.drain()
    rows = {r.tick_at - T: r for r in ticks(db)}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6, 7]
    assert rows[3].status == "failed" and rows[3].run_id is None
    assert f"the daemon {host}:{proc.pid} stopped during the run; not relaunched" \
        in rows[3].message
    assert [rows[t].status for t in (4, 5, 6)] == ["skipped"] * 3
    assert all(rows[t].message.startswith("missed while no daemon ran; the tick at ")
               for t in (4, 5, 6))
    assert rows[7].status == "launched" and rows[7].run_id in runs.run_ids
    assert len(runs.run_ids) == 2  # T+2 and T+7; T+3 never ran again
    gate.set()


def test_ticks_of_a_live_daemon_elsewhere_are_left_alone(db, runs):
    with db.session() as s:
        s.add(Schedule(name="every_second", cron="* * * * * *", selection="doubled",
                       daemon="elsewhere:1", heartbeat_at=T - 10, updated_at=T - 100))
        s.add(ScheduleTick(schedule="every_second", tick_at=T - 20, status="launched",
                           daemon="elsewhere:1", started_at=T - 20))
        s.add(ScheduleTick(schedule="every_second", tick_at=T - 30, status="launched",
                           daemon="elsewhere:2", started_at=T - 30))
    daemon(db, Clock(T)).start()
    rows = {r.daemon: r for r in ticks(db)}
    assert rows["elsewhere:1"].finished_at is None  # its heartbeat is fresh
    assert rows["elsewhere:2"].status == "failed"  # the schedule no longer names it


def test_latest_skips_a_tick_while_the_previous_run_goes(db, runs):
    clock = Clock(T)
    d = daemon(db, clock, catchup="latest")
    d.start()
    runs.hold()
    clock.now = T + 1.1
    d.evaluate(clock.now)
    wait_for(lambda: len(ticks(db)) == 1)
    clock.now = T + 2.1
    d.evaluate(clock.now)
    runs.release()
    d.drain()
    rows = ticks(db)
    assert [(r.tick_at - T, r.status) for r in rows] == [(1, "launched"), (2, "skipped")]
    assert rows[1].message == "previous run still running"


def test_all_queues_ticks_that_come_during_a_run(db, runs):
    clock = Clock(T)
    d = daemon(db, clock, catchup="all")
    d.start()
    runs.hold()
    for step in (1.1, 2.1, 3.1):
        clock.now = T + step
        d.evaluate(clock.now)
    runs.release()
    d.drain()
    assert [(r.tick_at - T, r.status) for r in ticks(db)] == \
        [(1, "launched"), (2, "launched"), (3, "launched")]


def test_once_runs_the_ticks_due_since_the_last_call(db, runs):
    clock = Clock(T)
    assert serve_until_signalled(daemon(db, clock), once=True) == 0  # first sight: nothing
    assert ticks(db) == []
    clock.now = T + 3.5
    assert serve_until_signalled(daemon(db, clock), once=True) == 0
    assert [(r.tick_at - T, r.status) for r in ticks(db)] == \
        [(1, "launched"), (2, "launched"), (3, "launched")]
    assert len(runs.run_ids) == 3


def test_a_failed_run_is_recorded_in_one_line(db, runs):
    clock = Clock(T)
    serve_until_signalled(daemon(db, clock), once=True)
    runs.error = dx.ExecutionError("task ('doubled@1', 0, 0) failed: MemoryError\nTraceback")
    clock.now = T + 1.5
    assert serve_until_signalled(daemon(db, clock), once=True) == 1  # --once says it failed
    [row] = ticks(db)
    assert (row.status, row.run_id, row.message) == \
        ("failed", None, "ExecutionError: task ('doubled@1', 0, 0) failed: MemoryError")
    assert row.finished_at is not None


def test_the_command_needs_schedules(tmp_path, capsys, monkeypatch):
    from deepx_flow.cli.main import main

    (tmp_path / "none.py").write_text("import deepx_flow as dx\ndefs = dx.Definitions()\n")
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    monkeypatch.setenv("DEEPX_DB_URL", url)  # --db sets it; put the session's back after
    assert main(["scheduler", "-m", str(tmp_path / "none.py"), "--db", url]) == 2
    assert "none.py has no schedules: add them as dx.Definitions(..., schedules=" in \
        capsys.readouterr().err


def test_a_stop_closes_the_run_still_going_and_drops_waiting_ticks(db, runs):
    clock = Clock(T)
    d = daemon(db, clock, catchup="all")
    d.start()
    runs.hold()
    clock.now = T + 3.5
    d.evaluate(clock.now)  # T+1 runs (and hangs), T+2 and T+3 wait
    wait_for(lambda: len(ticks(db)) == 1)
    d.shutdown(grace=0.2)
    [row] = ticks(db)
    assert (row.tick_at, row.status) == (T + 1, "failed")
    assert row.message == f"the daemon {d.me} stopped during the run; not relaunched"
    runs.release()  # the run ends late: the closed row stays as it is
    wait_for(lambda: not d.lanes["every_second"].waiting)
    assert [(r.tick_at, r.status) for r in ticks(db)] == [(T + 1, "failed")]


@pytest.mark.parametrize("stop", [None, "SIGTERM", "SIGKILL"])
def test_a_full_queue_then_a_stop_loses_no_tick_and_runs_none_twice(db, runs, stop):
    """catchup='all' with a full queue: the ticks that find no room are skipped, but their
    rows go in only once the queued ticks before them are claimed. So a stop or a kill
    while ticks wait leaves no row past them, and the next daemon decides them again:
    every tick gets one row, and every run belongs to one tick."""
    clock = Clock(T)
    host = socket.gethostname()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that no longer runs: the first daemon, once "killed"
    first = daemon(db, clock, catchup="all", me=f"{host}:{proc.pid}", max_queued=3)
    first.start()
    runs.hold()
    clock.now = T + 3.5
    first.evaluate(clock.now)  # T+1 runs (and hangs); T+2 and T+3 wait: the queue is full
    wait_for(lambda: len(ticks(db)) == 1)
    clock.now = T + 5.5
    first.evaluate(clock.now)  # T+4 and T+5 find no room: skipped, recorded after T+3
    assert [(r.tick_at - T, r.status) for r in ticks(db)] == [(1, "launched")]
    lane = first.lanes["every_second"]
    if stop is None:  # the runs go on: each skip is recorded once the claims before it are
        runs.release()
        first.drain()
        rows = ticks(db)
        assert [(r.tick_at - T, r.status) for r in rows] == [
            (1, "launched"), (2, "launched"), (3, "launched"), (4, "skipped"), (5, "skipped")]
        assert rows[3].message.startswith("more than 3 runs of this schedule would wait")
        assert sorted(r.run_id for r in rows[:3]) == sorted(runs.run_ids)
        return
    if stop == "SIGTERM":
        first.shutdown(grace=0.2)  # T+1 closed as failed; T+2 to T+5 dropped, with no row
    else:  # SIGKILL: the process and its memory are gone; it writes nothing more
        first.stopping.set()
        lane.current = None
    runs.release()  # T+1's run ends late: its row stays as it is
    wait_for(lambda: not lane.thread.is_alive())  # it ends with the run: stopping is set
    assert [(r.tick_at - T, r.status) for r in ticks(db)] == \
        [(1, "failed" if stop == "SIGTERM" else "launched")]

    clock.now = T + 6.5
    second = daemon(db, clock, catchup="all")
    second.start()  # resumes after T+1, the newest row
    second.evaluate(clock.now)
    second.drain()
    rows = {r.tick_at - T: r for r in ticks(db)}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]  # none lost: T+2 and T+3 waited, T+4, T+5 too
    assert (rows[1].status, rows[1].run_id) == ("failed", None)
    assert rows[1].message.endswith("stopped during the run; not relaunched")
    assert all(rows[t].status == "launched" and rows[t].daemon == second.me
               for t in (2, 3, 4, 5, 6))
    # One run for T+1 (its row closed, not relaunched) and one per tick launched since.
    assert len(runs.run_ids) == 6 == len(set(runs.run_ids))
    assert sorted(rows[t].run_id for t in (2, 3, 4, 5, 6)) == sorted(runs.run_ids[1:])
