"""Crash safety of materialization: a driver killed while it writes a new version leaves the
previous version readable and published, and the next materialization succeeds.

Version 1 is stored by this process. A second process, the `deepx-flow materialize` command
with its own embedded cluster, stores a 128 MB version 2 in many chunks; when its Zarr
folder holds some but not all of its chunk files, the driver's whole process group (its Dask
workers too) gets SIGKILL: no `finally`, no atexit, no cleanup runs. Or it gets SIGINT, as
a terminal's Ctrl-C sends, and stops cleanly.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from deepx_flow.storage.zarr_store import is_complete

import deepx_flow as dx
from deepx_flow.assets import catalog
from deepx_flow.assets.loading import load_definitions
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all

PIPELINE = """\
import deepx_flow as dx

ROWS, COLS = {rows}, {cols}


@dx.asset(code_version="{version}")
def big():
    i = dx.arange(ROWS, dtype="float64").reshape((ROWS, 1)) * COLS
    return dx.sqrt(i + dx.arange(COLS, dtype="float64")).astype("float32") + {version}.0


defs = dx.Definitions(assets=[big])
"""
SMALL, LARGE = (300, 200), (8192, 4096)  # the large one: 128 MB of float32


def expected(version: int, rows: int, cols: int) -> np.ndarray:
    return np.sqrt(np.arange(rows * cols, dtype=np.float64)).reshape(rows, cols) + version


def write_progress(folder: Path) -> tuple[int, int] | None:
    """(chunk files written, chunks in the array) of a Zarr v3 array being written; None
    while its metadata is not there yet."""
    try:
        meta = json.loads((folder / "zarr.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    grid = meta["chunk_grid"]["configuration"]["chunk_shape"]
    total = math.prod(-(-n // c) for n, c in zip(meta["shape"], grid))
    written = sum(len(files) for _, _, files in os.walk(folder / "c"))
    return written, total


@pytest.mark.timeout(180)
def test_killed_driver_leaves_the_previous_version(client, db_url, tmp_path, monkeypatch):
    root = tmp_path / "assets"
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(root))
    path = tmp_path / "pipeline.py"
    db = open_db(db_url)

    path.write_text(PIPELINE.format(version=1, rows=SMALL[0], cols=SMALL[1]))
    first = dx.materialize(load_definitions(str(path)), client=client).versions["big"]

    path.write_text(PIPELINE.format(version=2, rows=LARGE[0], cols=LARGE[1]))
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        # Many chunks, so the write is seen half done; a new session, so the group is the
        # driver and its cluster's processes.
        driver = subprocess.Popen(
            [sys.executable, "-m", "deepx_flow.cli.main", "materialize", "-m", str(path)],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "DEEPX_CHUNKS_PER_THREAD": "16"})
    try:
        partial, progress = None, None
        deadline = time.monotonic() + 120
        while partial is None:
            assert driver.poll() is None, \
                f"the driver ended before its write was seen half done:\n{log.read_text()}"
            assert time.monotonic() < deadline, "no version 2 write seen in 120 s"
            for folder in (root / "big").iterdir():
                if folder.name == Path(first.uri).name:
                    continue
                progress = write_progress(folder)
                if progress and 0 < progress[0] < progress[1]:
                    partial = folder
                    break
            else:
                time.sleep(0.005)
        os.killpg(driver.pid, signal.SIGKILL)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    time.sleep(0.5)  # had any writer survived, it would add chunks now
    written, total = write_progress(partial)
    assert written < total and not is_complete(str(partial)), f"{written} of {total} chunks"
    close_all()  # reopen the database, as the next process to use it would

    # Version 1 is still what is published and what loads.
    db = open_db(db_url)
    assert [r.version for r in catalog.history(db, "big")] == [first.version]
    np.testing.assert_allclose(dx.run(dx.load("big"), client=client), expected(1, *SMALL),
                               rtol=1e-6)
    # The killed driver never ended its run: opening the database found it and marked it.
    killed = [r for r in queries.list_runs(db, 100) if r.pid == driver.pid]
    assert len(killed) == 1 and killed[0].status == "interrupted"
    assert f":{driver.pid} died before the run finished" in killed[0].error

    # The next materialization of the same code stores version 2, and it loads.
    done = dx.materialize(load_definitions(str(path)), client=client)
    second = done.versions["big"]
    assert catalog.latest(db, "big").version == second.version != first.version
    assert Path(second.uri) != partial and is_complete(second.uri)
    np.testing.assert_allclose(dx.run(dx.load("big"), client=client), expected(2, *LARGE),
                               rtol=1e-6)


@pytest.mark.timeout(180)
def test_ctrl_c_stops_a_materialization_cleanly(db_url, tmp_path, monkeypatch):
    """Ctrl-C in a terminal signals the whole process group, the embedded cluster's workers
    too: the command says one line and exits 130, its partial version is deleted and its
    run is interrupted; the workers print nothing (each printed a KeyboardInterrupt
    traceback) and none is left."""
    import psutil

    root = tmp_path / "assets"
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(root))
    path = tmp_path / "pipeline.py"
    path.write_text(PIPELINE.format(version=2, rows=LARGE[0], cols=LARGE[1]))
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "deepx_flow.cli.main", "materialize", "-m", str(path)],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "DEEPX_CHUNKS_PER_THREAD": "16"},
            # As from a terminal: a suite started in the background (`cmd &` in a script)
            # ignores SIGINT, its children inherit that, and Python keeps it ignored.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while True:
            assert driver.poll() is None, f"it ended before its write began:\n{log.read_text()}"
            assert time.monotonic() < deadline, "no write seen in 120 s"
            progress = [write_progress(f) for f in root.glob("big/*.zarr")]
            if any(p and 0 < p[0] < p[1] for p in progress):
                break
            time.sleep(0.005)
        workers = [p for p in psutil.Process(driver.pid).children(recursive=True)
                   if "spawn_main" in " ".join(p.cmdline())]
        os.killpg(driver.pid, signal.SIGINT)  # as the terminal does
        assert driver.wait(timeout=60) == 130, log.read_text()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=30)
    text = log.read_text()
    assert workers and not alive, f"worker processes left: {alive}"
    assert text.splitlines()[-1] == "deepx-flow: interrupted", text
    assert "Traceback" not in text and "KeyboardInterrupt\n" not in text, text
    assert list(root.glob("big/*")) == []  # the partial version was deleted
    close_all()
    [run] = queries.list_runs(open_db(db_url), 10)
    assert run.pid == driver.pid and run.status == "interrupted"
