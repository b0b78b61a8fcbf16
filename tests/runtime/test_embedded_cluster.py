"""The default path of a script or notebook: one embedded cluster per process, started on
first use, kept, closed at exit (its workers then marked gone), `dx.shutdown()` closing it
earlier; a script without an `if __name__ == "__main__":` guard runs once. Each in a fresh
Python process, as a user's script runs."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(tmp_path: Path, body: str, timeout: float = 240):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = {"DEEPX_DB_URL": f"sqlite:///{tmp_path / 'deepx.db'}", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def table(tmp_path: Path, sql: str) -> list:
    with sqlite3.connect(tmp_path / "deepx.db") as db:
        return db.execute(sql).fetchall()


@pytest.mark.timeout(300)
def test_ten_runs_without_a_client_start_one_cluster_closed_at_exit(tmp_path):
    res = run_script(tmp_path, """
        import numpy as np
        import deepx_flow as dx

        if __name__ == "__main__":
            x = dx.input("x", shape=(1000, 8), dtype="float64")
            data = np.arange(8000.0).reshape(1000, 8)
            for i in range(10):
                out = dx.run((x * float(i)).sum(axis=0), inputs={"x": data})
                assert np.allclose(out, data.sum(axis=0) * i), i
            print("done")
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["done"]
    runs = table(tmp_path, "SELECT scheduler, status FROM runs")
    assert len(runs) == 10 and {s for _, s in runs} == {"succeeded"}
    assert len({scheduler for scheduler, _ in runs}) == 1
    workers = table(tmp_path, "SELECT scheduler, status FROM workers")
    assert workers and {w for w, _ in workers} == {runs[0][0]}
    assert {s for _, s in workers} == {"gone"}  # closed when the process exited


@pytest.mark.timeout(300)
def test_an_unguarded_script_runs_once(tmp_path):
    """The README's notebook code as a plain script, without the guard: worker processes
    do not run it again (it printed its plan once per worker, then failed with hundreds of
    lines of tracebacks)."""
    res = run_script(tmp_path, """
        import numpy as np
        import deepx_flow as dx

        x = dx.input("x", shape=(20_000, 64), dtype="float32")
        w = dx.random.normal((64, 128), seed=0, dtype="float32")
        y = dx.relu(x @ w + 1.0).sum(axis=1)
        print("planned", dx.compile(y).stats().tasks > 0)
        x_np = np.random.default_rng(0).standard_normal((20_000, 64), dtype="float32")
        out = dx.run(y, inputs={"x": x_np})
        w_np = dx.run(w).astype(np.float64)
        want = np.maximum(x_np.astype(np.float64) @ w_np + 1.0, 0).sum(axis=1)
        print("right", bool(np.allclose(out, want, rtol=1e-4)))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:2] == ["planned True", "right True"]
    assert res.stdout.count("planned") == 1
    assert "Traceback" not in res.stderr and len(res.stderr.splitlines()) <= 1


@pytest.mark.timeout(300)
def test_shutdown_closes_the_cluster_and_a_later_run_starts_a_new_one(tmp_path):
    res = run_script(tmp_path, """
        import deepx_flow as dx

        if __name__ == "__main__":
            assert dx.run(dx.arange(4.0).sum()) == 6.0
            dx.shutdown()
            assert dx.run(dx.arange(5.0).sum()) == 10.0
            print("ok")
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    first, second = [s for (s,) in table(tmp_path, "SELECT scheduler FROM runs "
                                                   "ORDER BY started_at")]
    assert first != second
    statuses = dict(table(tmp_path, "SELECT scheduler, group_concat(DISTINCT status) FROM "
                                    "workers GROUP BY scheduler"))
    assert statuses == {first: "gone", second: "gone"}


@pytest.mark.timeout(300)
def test_a_client_the_user_made_is_used_first(tmp_path):
    res = run_script(tmp_path, """
        import deepx_flow as dx
        from distributed import Client, LocalCluster

        if __name__ == "__main__":
            with LocalCluster(n_workers=1, processes=False) as cluster, Client(cluster) as c:
                assert dx.run(dx.arange(4.0).sum()) == 6.0
                print(c.scheduler.address)
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert table(tmp_path, "SELECT scheduler FROM runs") == [(res.stdout.strip(),)]


@pytest.mark.timeout(300)
def test_a_retried_task_that_then_succeeds_prints_nothing(tmp_path):
    """Dask's multi-line error block of a failed attempt stays out of the terminal: the
    attempt is recorded (a "retried" task row), and the run's result is right."""
    res = run_script(tmp_path, """
        import deepx_flow as dx
        from deepx_flow.kernels.faults import Fault, FaultInjection
        from deepx_flow.runtime.cluster import shared_client

        if __name__ == "__main__":
            shared_client().register_plugin(FaultInjection([Fault("raise", times=1)]))
            # Each worker process fails its first attempt once: retries for all of them.
            out = dx.run(dx.arange(6.0) * 2, recovery=dx.Recovery(retries=4, backoff=0))
            print(out.tolist())
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == str([0.0, 2.0, 4.0, 6.0, 8.0, 10.0]) and res.stderr == ""
    assert table(tmp_path, "SELECT count(*) FROM tasks WHERE status = 'retried'")[0][0] >= 1


@pytest.mark.timeout(120)
def test_cpu_only_embedded_cluster_takes_its_option():
    """`cpu=True` asks for plain workers where GPUs are; without GPUs it must not reach
    Dask's workers as an unknown argument (it did: the nanny failed to start)."""
    from distributed import Client

    from deepx_flow.runtime.cluster import start_embedded_cluster
    with start_embedded_cluster(n_workers=1, threads_per_worker=1, cpu=True) as cluster, \
            Client(cluster) as client:
        assert client.submit(sum, [1, 2, 3]).result() == 6
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 1


@pytest.mark.timeout(300)
def test_an_interrupt_of_the_process_group_leaves_the_workers_alone(tmp_path):
    """A notebook's "interrupt kernel" (and a terminal's Ctrl-C) signals the whole process
    group. The interrupted cell raises KeyboardInterrupt; the embedded cluster's workers,
    in the same group, took it too: each printed a traceback and died, losing what it held,
    and the nanny started another. They now never take it."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import os, signal, threading, time
        import psutil
        import deepx_flow as dx

        def workers():
            return sorted(p.pid for p in psutil.Process().children(recursive=True)
                          if "spawn_main" in " ".join(p.cmdline()))

        if __name__ == "__main__":
            assert dx.run(dx.arange(4.0).sum()) == 6.0
            before = workers()
            x = dx.random.normal((2000, 2000), seed=1)
            threading.Timer(1.0, os.killpg, (os.getpgid(0), signal.SIGINT)).start()
            try:
                for _ in range(100):  # a cell that runs for a while, interrupted
                    dx.run((x @ x).sum())
                print("not interrupted")
            except KeyboardInterrupt:
                print("interrupted")
            time.sleep(2)  # a worker that took the signal is gone, or restarting, by now
            print("same workers", len(before) > 0 and workers() == before)
            print("right", dx.run(dx.arange(5.0).sum()) == 10.0)
    """))
    env = {"DEEPX_DB_URL": f"sqlite:///{tmp_path / 'deepx.db'}", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    # Its own process group, as a notebook kernel has: the signal reaches nothing else.
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert out.splitlines() == ["interrupted", "same workers True", "right True"], out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
