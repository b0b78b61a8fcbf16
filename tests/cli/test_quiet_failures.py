"""Failures are quiet and exact from a shell: a failure while running on the embedded
cluster is one line (no worker log with stack frames before it), and Ctrl-C is one line
with the run recorded as interrupted, saying so (it printed distributed's `AllExit`
tracebacks and recorded an empty "KeyboardInterrupt: ")."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

from tests.helpers import without_run_headers

SUM_OF_INPUT = """\
deepx: 1
inputs:
  x: {shape: [600, 4], dtype: float64}
nodes:
  - {id: y, op: sum, args: [x], attrs: {axes: [1]}}
outputs: [y]
"""

LONG = """\
deepx: 1
nodes:
  - {id: x, op: random_normal, shape: [150000, 20000], dtype: float32, attrs: {seed: 0}}
  - {id: y, op: sum, args: [x], attrs: {axes: [1]}}
outputs: [y]
"""


def env(tmp_path):
    return {**os.environ, "DEEPX_DB_URL": f"sqlite:///{tmp_path / 'deepx.db'}",
            "DEEPX_SCHEDULER": ""}


@pytest.mark.timeout(300)
def test_a_failure_while_running_is_one_line(tmp_path):
    (tmp_path / "g.yaml").write_text(SUM_OF_INPUT)
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=(600, 4), chunks=(100, 4),
                            dtype="float64", zarr_format=3)
    arr[:] = np.arange(2400.0).reshape(600, 4)
    (tmp_path / "x.zarr" / "c" / "3" / "0").unlink()  # found only when a task reads it
    res = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "run", "g.yaml",
                          "--input", "x=x.zarr"], cwd=tmp_path, env=env(tmp_path),
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 2, res.stderr
    assert without_run_headers(res.stderr) == [res.stderr.splitlines()[-1]], res.stderr
    assert "chunk (3, 0) is missing" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.timeout(300)
def test_ctrl_c_is_one_line_and_the_run_says_it_was_interrupted(tmp_path):
    (tmp_path / "long.yaml").write_text(LONG)
    proc = subprocess.Popen([sys.executable, "-m", "deepx_flow.cli.main", "run", "long.yaml"],
                            cwd=tmp_path, env=env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    db = tmp_path / "deepx.db"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # interrupt once the run is going
        time.sleep(0.2)
        try:  # read-only: connecting must not create the file (an empty one is refused)
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                if con.execute("SELECT count(*) FROM runs").fetchone()[0] > 0:
                    break
        except sqlite3.Error:
            pass
    time.sleep(2.0)  # gathering its results
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert without_run_headers(err) == ["deepx-flow: interrupted"], err
    with sqlite3.connect(db) as con:
        [(run_id, status, error)] = con.execute("SELECT id, status, error FROM runs").fetchall()
    assert err.startswith(f"deepx_flow run {run_id}: ")  # named as it started
    assert status == "interrupted" and error.startswith("interrupted (KeyboardInterrupt")
