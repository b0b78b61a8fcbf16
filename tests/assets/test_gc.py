"""Partial version folders that killed materializations leave are removed, at the next
materialization of the asset and by `deepx-flow assets gc`, and a folder that a live
materialization is writing never is.

Each killed materialization is the `deepx-flow materialize` command with its own embedded
cluster, killed (SIGKILL to its whole process group) when its Zarr folder holds some but not
all of its chunks, as in `test_crash.py`. The live one is the same command on a cluster of
this process whose tasks are held (a "hang" fault) until the test lets them go.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.assets import catalog
from deepx_flow.assets.gc import Folder, judge
from deepx_flow.assets.loading import load_definitions
from deepx_flow.cli.main import main
from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.storage.zarr_store import is_complete
from tests.assets.test_crash import LARGE, PIPELINE, expected, write_progress


def version_folders(root: Path) -> dict[str, Path]:
    return {p.name[:-len(".zarr")]: p for p in (root / "big").glob("*.zarr")}


def materialize_command(path: Path, log: Path, *extra: str) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "deepx_flow.cli.main", "materialize", "-m", str(path),
             *extra], cwd=path.parent, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "DEEPX_CHUNKS_PER_THREAD": "16"})


def kill_while_writing(path: Path, root: Path, log: Path) -> Path:
    """Start a materialization and SIGKILL it (its workers too) half way through its write;
    the folder it left."""
    before = set(version_folders(root).values()) if (root / "big").exists() else set()
    driver = materialize_command(path, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert driver.poll() is None, f"it ended before its write was half done:\n" \
                                          f"{log.read_text()}"
            assert time.monotonic() < deadline, "no write seen half done in 120 s"
            new = set(version_folders(root).values()) - before if (root / "big").exists() \
                else set()
            progress = {f: write_progress(f) for f in new}
            partial = [f for f, p in progress.items() if p and 0 < p[0] < p[1]]
            if partial:
                break
            time.sleep(0.005)
        os.killpg(driver.pid, signal.SIGKILL)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    return partial[0]


def gc_output(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["assets", "gc", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.timeout(420)
def test_partial_folders_are_collected_and_a_live_write_is_not(client, scheduler, tmp_path,
                                                               monkeypatch, capsys):
    from distributed import Client

    from deepx_flow.kernels.faults import Fault, FaultInjection

    root = tmp_path / "assets"
    url = f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}"
    monkeypatch.setenv("DEEPX_DB_URL", url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(root))
    path = tmp_path / "pipeline.py"
    path.write_text(PIPELINE.format(version=2, rows=LARGE[0], cols=LARGE[1]))

    first = kill_while_writing(path, root, tmp_path / "killed0.log")
    second = kill_while_writing(path, root, tmp_path / "killed1.log")
    # Each left its partial folder; the second materialization removed the first's.
    assert set(version_folders(root).values()) == {second} and not is_complete(str(second))
    assert not first.exists()
    close_all()  # a new process would open the database anew
    db = open_db(url)
    out = gc_output(capsys, "--dry-run")
    assert f"would remove  big    {second.name[:12]}  partial: its writer" in out, out
    assert second.exists()

    # A live materialization on a cluster of this process, its tasks held: its folder is
    # made and its run is going, and nothing of it is written until they are let go.
    with Client(scheduler) as holder:
        workers = list(holder.scheduler_info(n_workers=-1)["workers"])
        holder.register_plugin(FaultInjection([Fault("hang", worker=w) for w in workers]))
        live = materialize_command(path, tmp_path / "live.log", "--scheduler", scheduler)
        try:
            deadline = time.monotonic() + 120
            while not (set(version_folders(root).values()) - {second}):
                assert live.poll() is None, (tmp_path / "live.log").read_text()
                assert time.monotonic() < deadline, "the live write made no folder in 120 s"
                time.sleep(0.05)
            [writing] = set(version_folders(root).values()) - {second}
            while write_progress(writing) is None:  # its metadata, with its writer
                time.sleep(0.05)
            assert not second.exists()  # removed as the live materialization began

            # Killed while the live one waits: its start left the live folder alone.
            third = kill_while_writing(path, root, tmp_path / "killed2.log")
            assert set(version_folders(root).values()) == {writing, third}
            out = gc_output(capsys, "--dry-run")
            me = f"{socket.gethostname()}:{live.pid}"
            assert f"would remove  big    {third.name[:12]}  partial: its writer" in out, out
            assert f"kept          big    {writing.name[:12]}  being written: its writer " \
                   f"{me} is running" in out, out
            out = gc_output(capsys)
            assert "1 partial version folder removed, 1 kept" in out, out
            assert f"removed  big    {third.name[:12]}" in out, out
            assert not third.exists() and writing.exists()

            # The next materialization stores its version beside the live one's folder.
            done = dx.materialize(load_definitions(str(path)), client=client, db=url)
            stored = done.versions["big"]
            assert set(version_folders(root)) == {writing.name[:-5], stored.version}
            np.testing.assert_allclose(dx.run(dx.load("big", version=stored.version),
                                              client=client), expected(2, *LARGE), rtol=1e-6)
        finally:
            holder.unregister_worker_plugin(FaultInjection.name)  # let the live one go
            try:
                assert live.wait(timeout=180) == 0, (tmp_path / "live.log").read_text()
            finally:
                if live.poll() is None:
                    os.killpg(live.pid, signal.SIGKILL)

    # The live one published its version, whole and right.
    assert writing.exists() and is_complete(str(writing))
    row = next(r for r in catalog.history(db, "big") if r.version == writing.name[:-5])
    np.testing.assert_allclose(dx.run(dx.load("big", version=row.version), client=client),
                               expected(2, *LARGE), rtol=1e-6)
    # No partial folder is left: every version folder is a published version.
    assert set(version_folders(root)) == {r.version for r in catalog.history(db, "big")}
    assert "no unpublished version folders" in gc_output(capsys)


def folder(writer=None, complete=False, age=10.0) -> Folder:
    return Folder("/r/a/v.zarr", "a", "v" * 32, complete, writer, age)


def test_what_is_kept_and_what_is_removed():
    here = {"host": "this", "pid": 7, "at": 100.0}
    there = {"host": "other", "pid": 7, "at": 100.0}
    keep = dict(host="this", writer_gone=None, running_run=None, grace_s=60.0)
    # A writer on this host decides alone, whatever the folder's age.
    assert not judge(folder(here, age=1e6), **{**keep, "writer_gone": False}).remove
    assert judge(folder(here, age=0.0), **{**keep, "writer_gone": True}).remove
    # A complete folder without a row is never removed: another database may publish it.
    assert not judge(folder(here, complete=True), **{**keep, "writer_gone": True}).remove
    assert not judge(folder(None, complete=True, age=1e6), **keep).remove
    # Another host's writer: kept while a run of it is running, or within the grace period.
    assert not judge(folder(there, age=1e6), **{**keep, "running_run": "r" * 32}).remove
    assert not judge(folder(there, age=59.0), **keep).remove
    assert judge(folder(there, age=61.0), **keep).remove
    # No writer recorded: by its age; an unknown age keeps it.
    assert not judge(folder(None, age=59.0), **keep).remove
    assert judge(folder(None, age=61.0), **keep).remove
    assert not judge(folder(None, age=None), **keep).remove


def test_a_writer_on_another_host_is_judged_by_its_runs_and_the_grace_period(env, tmp_path,
                                                                            monkeypatch):
    """Another host's processes cannot be seen from here: its folder is kept while the
    database has a run of its writer running, or while it is younger than the grace
    period; a folder that records no writer is judged by its age alone."""
    import json
    import time as clock
    import uuid

    from deepx_flow.assets.gc import collect
    from deepx_flow.meta import store
    from deepx_flow.meta.models import Run
    from deepx_flow.storage.zarr_store import WRITER_ATTR, create_array

    monkeypatch.setenv("DEEPX_GC_GRACE_S", "60")
    now = clock.time()
    folders = {}
    for name in ("running", "ended", "young", "no_writer"):
        uri = str(tmp_path / "assets" / "x" / f"{uuid.uuid4().hex}.zarr")
        create_array(uri, (4,), "float32", ((4,),))
        meta = json.loads(Path(uri, "zarr.json").read_text())
        pid = {"running": 11, "ended": 12, "young": 13}.get(name)
        at = now - (10 if name == "young" else 3600)
        meta["attributes"][WRITER_ATTR] = {"host": "elsewhere", "pid": pid, "at": at}
        if name == "no_writer":
            del meta["attributes"][WRITER_ATTR]
        Path(uri, "zarr.json").write_text(json.dumps(meta))
        os.utime(uri, (at, at))  # the folder's time, for the one that records no writer
        folders[name] = Path(uri)
    for pid, status in ((11, "running"), (12, "failed")):
        store.begin_run(env, Run(id=uuid.uuid4().hex, graph_hash="g", status=status,
                                 started_at=now - 3000, scheduler="tcp://elsewhere:1",
                                 cluster="c", n_workers=1, n_tasks=1, n_chunks=1,
                                 host="elsewhere", pid=pid, username="u"), "", 0)

    verdicts = {Path(v.folder.uri): v for v in collect(env, ["x"], dry_run=True, now=now)}
    remove = {name for name, p in folders.items() if verdicts[p].remove}
    assert remove == {"ended", "no_writer"}, {n: verdicts[p].why for n, p in folders.items()}
    assert "of its writer elsewhere:11 is running" in verdicts[folders["running"]].why
    assert "grace period of 60 s" in verdicts[folders["young"]].why
    assert all(p.exists() for p in folders.values())  # a dry run removes nothing
    collect(env, ["x"], now=now)
    assert {name for name, p in folders.items() if not p.exists()} == {"ended", "no_writer"}
