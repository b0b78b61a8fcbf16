"""Progress of a run as a user sees it: the run's id and dashboard link, then a bar that
counts every task of the run (not only the outputs) with the bytes computed, shown only once
a run has gone on for a while; the CLI names its run as it starts."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.kernels.faults import Fault
from deepx_flow.meta import open_db
from deepx_flow.meta.models import Run, Task
from deepx_flow.runtime.progress import RunProgress, run_link
from tests.helpers import cluster_with_memory, faults_on

SPEC = cluster_with_memory(8 * 2**20)  # 1 MiB chunks of x: a few dozen tasks


def slow_graph():
    x = dx.input("x", shape=(64_000, 32), dtype="float64")
    return x, (dx.exp(x * 0.5) + 1.0).sum(axis=0)


def bar_states(text: str) -> list[tuple[int, int]]:
    """The (done, total) counts the bar showed, in order."""
    return [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+) \[", text)]


def test_a_long_run_shows_its_id_its_link_and_every_task_counted(client):
    x, y = slow_graph()
    data = np.random.default_rng(0).standard_normal((64_000, 32))
    stream = io.StringIO()
    progress = RunProgress(show=True, show_after=0.2, stream=stream)
    # One task hangs (the threaded workers share this process: `times` counts once for
    # both) while the others finish; the bar must count them before it is released.
    with faults_on(client, Fault("hang", times=1)):
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(dx.run, y, inputs={"x": data}, client=client,
                                  cluster=SPEC, progress=progress)
            deadline = time.monotonic() + 120
            while not any(0 < done for done, _ in bar_states(stream.getvalue())):
                assert time.monotonic() < deadline, stream.getvalue()
                assert not running.done(), "the run ended while a task hung"
                time.sleep(0.1)
            during = bar_states(stream.getvalue())
    out = running.result(timeout=120)
    np.testing.assert_allclose(out, (np.exp(data * 0.5) + 1.0).sum(axis=0), rtol=1e-12)
    text = stream.getvalue()
    assert progress.shown
    header = text.splitlines()[0]
    assert header == (f"deepx_flow run {progress.run_id}: {progress.total:,} tasks; "
                      f"dashboard {run_link(progress.run_id)} (deepx-flow ui)")
    states = bar_states(text)
    assert states and all(total == progress.total for _, total in states)
    assert states[-1][0] == progress.total  # it ends full
    assert any(0 < done < progress.total for done, _ in during)  # and counted on the way
    assert re.search(r"\d+(\.\d+)? [KMG]?i?B\]", text)  # the bytes computed so far
    # The id is the recorded run's, and the total its task count.
    db = open_db()
    with db.read() as session:
        run = session.get(Run, progress.run_id)
        tasks = session.exec(select(Task).where(Task.run_id == run.id)).all()
    assert run.status == "succeeded"
    # (The hung task gets a backup attempt on the other worker, a task of its own.)
    assert progress.total == len({t.key for t in tasks if "~backup" not in t.key}) > 8


def test_a_short_run_shows_nothing(client):
    stream = io.StringIO()
    progress = RunProgress(show=True, stream=stream)  # the default wait: 2 s
    x = dx.input("x", shape=(100,), dtype="float64")
    out = dx.run(x + 1.0, inputs={"x": np.arange(100.0)}, client=client, progress=progress)
    np.testing.assert_array_equal(out, np.arange(100.0) + 1.0)
    assert stream.getvalue() == "" and not progress.shown


def test_progress_false_shows_nothing_however_long(client):
    x, y = slow_graph()
    data = np.ones((64_000, 32))
    stream = io.StringIO()
    progress = RunProgress(show=False, show_after=0.0, stream=stream)
    with faults_on(client, Fault("slow", factor=10)):
        dx.run(y, inputs={"x": data}, client=client, cluster=SPEC, progress=progress)
    assert stream.getvalue() == ""


def test_the_cli_names_its_run_as_it_starts(tmp_path):
    """`deepx-flow run` prints the run id and the dashboard link before the run's result,
    and that id is the one `runs show` knows."""
    spec = tmp_path / "g.yaml"
    dx.to_yaml({"y": (dx.arange(1000, dtype="float64") * 2.0).sum()}, spec)
    db = f"sqlite:///{tmp_path}/deepx.db"
    done = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "run", str(spec),
                           "--db", db], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = re.search(r"^deepx_flow run ([0-9a-f]{32}): \d+ tasks; dashboard (\S+)",
                      done.stderr, re.M)
    assert found, done.stderr
    assert found.group(2).endswith(f"/run?id={found.group(1)}")
    assert "y: shape () float64" in done.stdout
    shown = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "runs", "show",
                            found.group(1), "--db", db], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    assert shown.returncode == 0 and found.group(1) in shown.stdout, shown.stderr


def test_the_wait_before_the_bar_is_a_setting(monkeypatch):
    from deepx_flow.config import settings
    monkeypatch.delenv("DEEPX_PROGRESS_AFTER_S", raising=False)
    assert RunProgress.of(None).show_after == 2.0 == settings().progress_after_s
    monkeypatch.setenv("DEEPX_PROGRESS_AFTER_S", "0")
    assert RunProgress.of(None).show_after == 0.0
    assert RunProgress.of(True).show_after == 0.0
    for text in ("-1", "soon", "inf", "nan"):
        monkeypatch.setenv("DEEPX_PROGRESS_AFTER_S", text)
        with pytest.raises(dx.SettingsError, match="DEEPX_PROGRESS_AFTER_S must be a number "
                                                   f"of seconds, 0 or more and at most "
                                                   f"604,800, got '{text}'"):
            settings()
