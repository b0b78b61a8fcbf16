"""Drivers that end, as real processes on their embedded clusters, and what the registry
then says: a script that exits, one that calls dx.shutdown(), one stopped with SIGTERM (what
Jupyter sends a kernel slow to stop), one killed with SIGKILL, and one still running.
`deepx-flow registry show` lists the live one only (the killed one once its heartbeat
timeout has passed) and, with --all, every one of them. A forked child that is terminated
marks nothing of its parent's."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from sqlmodel import select

from deepx_flow.cli import registry_cmd
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Worker

pytestmark = pytest.mark.slow

TIMEOUT_S = 15.0  # the drivers' and the readers' heartbeat timeout: 30 beats of 0.5 s

DRIVER = """
    import os, signal, sqlite3, sys, time
    import deepx_flow as dx
    from deepx_flow.runtime.cluster import shared_client

    def statuses(scheduler):
        with sqlite3.connect(os.environ["DB_PATH"]) as db:
            return sorted({s for (s,) in db.execute(
                "SELECT status FROM workers WHERE scheduler = ?", (scheduler,))})

    if __name__ == "__main__":
        mode = sys.argv[1]
        assert dx.run(dx.arange(4.0).sum()) == 6.0
        scheduler = shared_client().scheduler.address
        print("scheduler", scheduler, flush=True)
        if mode == "shutdown":
            dx.shutdown()
            print("after shutdown", statuses(scheduler), flush=True)
        elif mode == "fork":
            child = os.fork()
            if child == 0:  # as a multiprocessing pool's worker is terminated
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
                os._exit(3)
            _, status = os.waitpid(child, 0)
            print("child", os.waitstatus_to_exitcode(status), statuses(scheduler), flush=True)
        elif mode == "hold":
            print("ready", flush=True)
            time.sleep(600)
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    """The drivers' environment (a fresh database, beats of 0.5 s, a 15 s timeout), set
    here too for the `registry show` this process runs."""
    db_path = tmp_path / "deepx.db"
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    values = {"DEEPX_DB_URL": f"sqlite:///{db_path.as_posix()}", "DB_PATH": str(db_path),
              "DEEPX_HEARTBEAT_S": "0.5", "DEEPX_HEARTBEAT_TIMEOUT_S": str(TIMEOUT_S)}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DEEPX_SCHEDULER", raising=False)
    return {**os.environ, **values, "PYTHONUNBUFFERED": "1"}


class Driver:
    """One driver process: its scheduler address once it has run, its output lines."""

    def __init__(self, tmp_path: Path, env: dict, mode: str):
        self.log = tmp_path / f"{mode}-{time.monotonic_ns()}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "driver.py", mode], cwd=tmp_path,
                                         env=env, stdout=out, stderr=subprocess.STDOUT)
        self.family: list[psutil.Process] = []

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def wait_for(self, start: str, timeout: float = 180.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [line for line in self.lines() if line.startswith(start)]
            if found:
                if self.proc.poll() is None:  # its worker processes, to end them at the end
                    try:
                        self.family = psutil.Process(self.proc.pid).children(recursive=True)
                    except psutil.Error:
                        pass
                return found[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"the driver did not print {start!r}:\n{self.log.read_text()}")

    @property
    def scheduler(self) -> str:
        return self.wait_for("scheduler ").split()[1]

    def end(self, sig=None) -> int:
        """Send `sig` (or wait for the exit); then end the worker processes it left."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(120)
        for p in self.family:  # a killed driver's nannies may outlive it
            try:
                p.kill()
            except psutil.Error:
                pass
        return code


def show(*args) -> str:
    """`deepx-flow registry show`, parsed as main.py parses it; its output."""
    import contextlib
    import io
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", metavar="URL")
    parser = argparse.ArgumentParser(prog="deepx-flow")
    registry_cmd.add_parser(parser.add_subparsers(dest="command", required=True), [db])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert registry_cmd.run(parser.parse_args(["registry", "show", *args])) == 0
    return out.getvalue()


def listed(text: str) -> dict[str, str]:
    """scheduler -> its summary line, for each cluster `registry show` printed."""
    return {line.split()[1].rstrip(":"): line for line in text.splitlines()
            if line.startswith("Scheduler ")}


@pytest.mark.timeout(600)
def test_registry_show_lists_the_live_cluster_and_the_history_on_request(tmp_path, env):
    drivers = []
    try:
        exited = Driver(tmp_path, env, "exit")
        drivers.append(exited)
        assert exited.end() == 0, exited.log.read_text()
        closed = Driver(tmp_path, env, "shutdown")
        drivers.append(closed)
        assert closed.wait_for("after shutdown") == "after shutdown ['gone']"  # still running
        assert closed.end() == 0

        terminated = Driver(tmp_path, env, "hold")
        drivers.append(terminated)
        terminated.wait_for("ready")
        assert terminated.end(signal.SIGTERM) == -signal.SIGTERM  # ended as SIGTERM ends
        after_term = listed(show("--all"))[terminated.scheduler]
        assert "0 worker(s) running, 2 gone" in after_term  # at once: no timeout to wait

        killed = Driver(tmp_path, env, "hold")
        drivers.append(killed)
        killed.wait_for("ready")
        killed_at = time.time()
        assert killed.end(signal.SIGKILL) == -signal.SIGKILL
        live = Driver(tmp_path, env, "hold")
        drivers.append(live)
        live.wait_for("ready")

        # The killed one is live until its last beat is TIMEOUT_S old, then gone.
        end = time.monotonic() + 120
        while killed.scheduler in listed(show()):
            assert time.monotonic() < end, show("--all")
            time.sleep(0.5)
        assert time.time() - killed_at >= TIMEOUT_S - 1.0
        text = show()
        assert list(listed(text)) == [live.scheduler], text
        assert "2 worker(s) running, 0 gone" in listed(text)[live.scheduler]
        assert "4 closed or gone cluster(s) not shown (deepx-flow registry show --all)" in text
        everything = show("--all")
        shown = listed(everything)
        assert set(shown) == {d.scheduler for d in drivers}, everything
        for gone in (exited, closed, terminated, killed):
            assert "0 worker(s) running, 2 gone" in shown[gone.scheduler], everything
        # show marked the killed one's rows gone: any reader now sees it so
        with open_db().read() as s:
            assert set(s.exec(select(Worker.status).where(
                Worker.scheduler == killed.scheduler)).all()) == {"gone"}
    finally:
        for driver in drivers:
            driver.end(signal.SIGKILL)


@pytest.mark.timeout(300)
def test_a_forked_child_that_is_terminated_marks_nothing_of_its_parents(tmp_path, env):
    driver = Driver(tmp_path, env, "fork")
    try:
        line = driver.wait_for("child ")
        assert line == f"child {-signal.SIGTERM} ['running']", driver.log.read_text()
        assert driver.end() == 0
        # The parent's own exit does.
        assert "0 worker(s) running, 2 gone" in listed(show("--all"))[driver.scheduler]
    finally:
        driver.end(signal.SIGKILL)
