"""The acceptance test: a real `deepx-flow scheduler` process with a per-second cron,
killed (SIGKILL) after a few ticks, restarted, then stopped (SIGTERM). Every tick of the
whole window is recorded exactly once, the ticks missed while it was down are handled as
the catch-up policy says, and every launched tick made exactly one run and one stored
version."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlmodel import select

from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.meta.models import AssetMaterialization, Run, ScheduleTick

PIPELINE = """
import deepx_flow as dx

@dx.asset
def doubled():
    return dx.ones((4, 4)) * 2

defs = dx.Definitions(assets=[doubled], schedules=[
    dx.schedule("* * * * * *", "doubled", name="every_second", catchup={catchup!r})])
"""


def start(tmp_path: Path, url: str, life: int,
          new_group: bool = False) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"life{life}.log"
    env = {**os.environ, "DEEPX_ASSET_ROOT": str(tmp_path / "assets"), "DEEPX_DB_URL": url,
           "PYTHONUNBUFFERED": "1"}
    env.pop("DEEPX_SCHEDULER", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "deepx_flow.cli.main", "scheduler",
                                 "-m", str(tmp_path / "pipeline.py"), "--db", url],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=new_group)
    return proc, log


def rows(db, model, order=None) -> list:
    with db.read() as s:
        query = select(model)
        return list(s.exec(query.order_by(order) if order is not None else query))


def wait_for(condition, what: str, logs, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}:\n" +
                        "\n".join(log.read_text() for log in logs))
        time.sleep(0.1)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("catchup", ["all", "latest"])
def test_every_tick_is_launched_once_across_a_restart(tmp_path, catchup):
    (tmp_path / "pipeline.py").write_text(textwrap.dedent(PIPELINE.format(catchup=catchup)))
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    db = open_db(url)

    def ticks():
        return rows(db, ScheduleTick, ScheduleTick.tick_at)

    def done():
        return [t for t in ticks() if t.run_id]

    first, log1 = start(tmp_path, url, 1)
    try:
        wait_for(lambda: len(done()) >= 3, "three ticks run by the first daemon", [log1])
    finally:
        first.send_signal(signal.SIGKILL)  # mid-run or between runs: either must hold
        first.wait(30)
    killed_at = time.time()
    time.sleep(2.5)  # down for at least two ticks, however fast a daemon starts
    second, log2 = start(tmp_path, url, 2)
    try:
        wait_for(lambda: "materializes 'doubled'" in log2.read_text(),
                 "the second daemon to start", [log1, log2])
        awake = time.time()
        wait_for(lambda: any(t.tick_at >= awake + 2 for t in done()),
                 "the second daemon to catch up and run new ticks", [log1, log2])
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, log2.read_text()
    assert "Traceback" not in log2.read_text()  # a clean stop prints none (nor at exit)
    logs = log1.read_text() + log2.read_text()

    recorded = ticks()
    times = [t.tick_at for t in recorded]
    # One row per tick, every second from the first tick to the last: none lost, none twice.
    assert times == [times[0] + i for i in range(len(times))], logs
    lives = list(dict.fromkeys(t.daemon for t in recorded))
    assert len(lives) == 2, logs
    second_rows = [t for t in recorded if t.daemon == lives[1]]
    woke = min(t.started_at for t in second_rows)
    gap = [t for t in second_rows if t.tick_at < woke]  # missed while no daemon ran
    assert len(gap) >= 2 and gap[-1].tick_at >= killed_at + 1, logs  # the whole downtime

    # At most one tick was cut short by the kill: closed, not relaunched.
    cut = [t for t in recorded if t.status == "failed"]
    assert len(cut) <= 1 and all(t.daemon == lives[0] and t.run_id is None and
                                 "stopped during the run; not relaunched" in t.message
                                 for t in cut), logs
    launched = [t for t in recorded if t.status == "launched"]
    assert all(t.finished_at is not None and t.run_id for t in launched), logs
    if catchup == "all":
        assert [t.status for t in recorded if t not in cut] == ["launched"] * (
            len(recorded) - len(cut)), logs
    else:
        assert [t.status for t in gap] == ["skipped"] * (len(gap) - 1) + ["launched"], logs
        assert all(t.message.startswith("missed while no daemon ran") for t in gap[:-1])
        # Elsewhere a tick is skipped only when a run took longer than a second.
        assert all(t.status == "launched" or "previous run still running" in t.message
                   or "while the daemon was busy" in t.message
                   for t in recorded if t not in gap), logs

    # One run and one stored version per launched tick; no tick made two.
    run_ids = [t.run_id for t in launched]
    assert len(set(run_ids)) == len(run_ids)
    runs = {r.id: r for r in rows(db, Run)}
    assert all(runs[r].status == "succeeded" for r in run_ids)
    made: dict = {}
    for m in rows(db, AssetMaterialization):
        assert m.asset == "doubled"
        made[m.run_id] = made.get(m.run_id, 0) + 1
    assert all(made.get(r) == 1 for r in run_ids), made
    assert set(made) - set(run_ids) <= {None} and len(set(made) - set(run_ids)) <= len(cut)
    close_all()


@pytest.mark.timeout(150)
def test_a_daemon_stopped_with_sigterm_is_shown_stopped_at_once(tmp_path):
    """It said "alive" for three minutes (until its heartbeat went stale): a clean stop is
    recorded on its schedules, and the cluster it ran on is marked gone as it exits."""
    from deepx_flow.meta.models import Schedule, Worker
    from deepx_flow.ui.pages.schedules import SCHEDULES
    from tests.ui.paging import every_page

    (tmp_path / "pipeline.py").write_text(textwrap.dedent(PIPELINE.format(catchup="latest")))
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    db = open_db(url)

    def state() -> str:
        [row] = every_page(SCHEDULES, db, "name", False, 10)
        return row["state"]

    daemon, log = start(tmp_path, url, 1)
    try:
        wait_for(lambda: any(t.run_id for t in rows(db, ScheduleTick)), "a tick's run", [log])
        assert state() == "alive"
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(60) == 0, log.read_text()
    me = f"{socket.gethostname()}:{daemon.pid}"
    assert log.read_text().splitlines()[-1] == f"scheduler {me} stopped (SIGTERM)"
    [schedule] = rows(db, Schedule)
    assert schedule.daemon == me and schedule.stopped_at >= schedule.heartbeat_at
    assert state() == "stopped"
    workers = rows(db, Worker)
    assert workers and {w.status for w in workers} == {"gone"}
    close_all()


@pytest.mark.timeout(150)
def test_ctrl_c_stops_the_daemon_and_its_workers_without_a_traceback(tmp_path):
    """A terminal's Ctrl-C signals the whole process group: the daemon and its embedded
    cluster's worker processes. The daemon stops cleanly; each worker printed its own
    KeyboardInterrupt traceback after the daemon's last line (60+ lines in all)."""
    import psutil

    (tmp_path / "pipeline.py").write_text(textwrap.dedent(PIPELINE.format(catchup="latest")))
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    db = open_db(url)
    daemon, log = start(tmp_path, url, 1, new_group=True)
    try:
        wait_for(lambda: any(t.run_id for t in rows(db, ScheduleTick)), "a tick's run", [log])
        workers = [p for p in psutil.Process(daemon.pid).children(recursive=True)
                   if "spawn_main" in " ".join(p.cmdline())]
        assert workers, "no worker processes: the embedded cluster is not the real one"
        os.killpg(daemon.pid, signal.SIGINT)  # as the terminal does
        assert daemon.wait(60) == 0, log.read_text()  # a signal stops it: status 0
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(30)
    _, alive = psutil.wait_procs(workers, timeout=30)
    text = log.read_text()
    me = f"{socket.gethostname()}:{daemon.pid}"
    assert text.splitlines()[-1] == f"scheduler {me} stopped (SIGINT)", text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert not alive, f"worker processes left: {alive}"
    close_all()
