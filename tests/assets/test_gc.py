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
from deepx_flow.processes import Process, can_look_up, pid_space, this_process
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


SPACE = "b00t/4:4026531836"  # a boot id and a PID namespace
ME = Process("this", SPACE, 1)


def test_what_is_kept_and_what_is_removed():
    here = {"host": "this", "space": SPACE, "pid": 7, "at": 100.0}
    there = {"host": "other", "space": SPACE, "pid": 7, "at": 100.0}
    keep = dict(me=ME, writer_gone=None, running_run=None, grace_s=60.0)
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


@pytest.mark.parametrize("space, why", [
    ("0ther/4:4026531836", "another machine of the same name (another boot id)"),
    ("b00t/4:4026532999", "a container of the same host name (its own PID namespace)"),
    (None, "a writer that recorded no PID space (before spaces were recorded)"),
])
def test_a_writer_of_this_host_name_in_another_pid_space_is_not_looked_up(space, why):
    """Its pid means another process here: found 'gone' by it, its folder was removed while
    it wrote. It is judged as another host's writer is: by its runs and the grace period."""
    writer = {"host": "this", "space": space, "pid": 7, "at": 100.0}
    assert not can_look_up(folder(writer).writer_process, ME), why
    rule = dict(me=ME, writer_gone=True, running_run=None, grace_s=60.0)  # pid 7 gone here
    young = judge(folder(writer, age=10.0), **rule)
    assert not young.remove and "grace period of 60 s" in young.why, why
    assert not judge(folder(writer, age=1e6), **{**rule, "running_run": "r" * 32}).remove
    assert judge(folder(writer, age=61.0), **rule).remove
    # The same writer in this process's own space is looked up by its pid.
    mine = {**writer, "space": SPACE}
    assert judge(folder(mine, age=10.0), **rule).remove
    assert not judge(folder(mine, age=1e6), **{**rule, "writer_gone": False}).remove


def test_which_processes_can_be_looked_up_by_pid():
    assert can_look_up(Process("h", "b/4:1", 5), Process("h", "b/4:1", 9))
    assert not can_look_up(Process("g", "b/4:1", 5), Process("h", "b/4:1", 9))  # host
    assert not can_look_up(Process("h", "c/4:1", 5), Process("h", "b/4:1", 9))  # boot
    assert not can_look_up(Process("h", "b/4:2", 5), Process("h", "b/4:1", 9))  # namespace
    assert not can_look_up(Process("h", None, 5), Process("h", "b/4:1", 9))  # not recorded
    assert not can_look_up(Process("h", None, 5), Process("h", None, 9))  # nor known here
    me = this_process()
    assert me.pid == os.getpid() and me.host == socket.gethostname()
    assert me.space and me.space == pid_space()  # Linux: a boot id and a PID namespace
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    ns = os.stat("/proc/self/ns/pid")
    assert me.space == f"{boot}/{ns.st_dev}:{ns.st_ino}"


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


# A writer in a PID namespace of its own, on this host name: init of that namespace (pid 1)
# sets the next pid to a number no process here has, and starts the writer with it.
IN_ANOTHER_PID_NAMESPACE = """
import subprocess, sys
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(int(sys.argv[1]) - 1))
sys.exit(subprocess.call([sys.executable, "-c", sys.argv[2], *sys.argv[3:]]))
"""
WRITER = """
import json, sys, time, uuid
from deepx_flow.meta import open_db, store
from deepx_flow.meta.models import Run
from deepx_flow.processes import this_process
from deepx_flow.storage.zarr_store import create_array
uri, url = sys.argv[1], sys.argv[2]
create_array(uri, (4,), "float32", ((4,),))  # its metadata names its writer, the write goes on
me = this_process()
store.begin_run(open_db(url), Run(id=uuid.uuid4().hex, graph_hash="g", status="running",
                                  started_at=time.time(), scheduler="tcp://h:1", cluster="c",
                                  n_workers=1, n_tasks=1, n_chunks=1, host=me.host,
                                  pid=me.pid, pid_space=me.space, username="u"), "", 0)
print(json.dumps([me.pid, me.space]), flush=True)
sys.stdin.readline()  # writing until the test lets it go
"""


def unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not unshare_works(), reason="needs unshare --pid (root on Linux)")
def test_a_live_writer_in_another_pid_namespace_keeps_its_folder_and_its_run(env, tmp_path):
    """A container of the same host name with its own PID namespace: its writer's pid is no
    process here. Looked up by pid, it was found gone: its folder was removed mid-write by
    collect, and its run marked interrupted by the next process that opened the database."""
    import json
    import random

    import psutil

    from deepx_flow.assets.gc import collect
    from deepx_flow.meta import queries
    from deepx_flow.meta.orphans import interrupt_orphaned_runs

    free = [p for p in range(20_000, 32_000) if not psutil.pid_exists(p)]
    pid = random.choice(free)
    uri = str(tmp_path / "assets" / "x" / f"{'c' * 32}.zarr")
    writer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
         IN_ANOTHER_PID_NAMESPACE, str(pid), WRITER, uri, env.url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[2])
    try:
        line = writer.stdout.readline()
        assert line, writer.stderr.read() if writer.poll() is not None else "no line"
        its_pid, its_space = json.loads(line)
        assert its_pid == pid and not psutil.pid_exists(pid)  # no such process here
        assert its_space and its_space != pid_space()  # this boot, another PID namespace

        (verdict,) = collect(env, ["x"], dry_run=True)
        # Judged as another host's writer: by its run, running (and its age).
        assert not verdict.remove and f"of its writer {socket.gethostname()}:{pid} is " \
                                      f"running" in verdict.why, verdict.why
        assert interrupt_orphaned_runs(env) == []
        collect(env, ["x"])
        assert Path(uri, "zarr.json").exists()
        (run,) = queries.list_runs(env)
        assert run.status == "running" and run.pid == pid and run.pid_space == its_space
    finally:
        writer.communicate("go\n", timeout=60)
    assert writer.returncode == 0




def counting_memory_fs():
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Counting(MemoryFileSystem):
        protocol = "countmem"
        store: dict = {}
        pseudo_dirs = [""]
        metadata_reads = 0

        @classmethod
        def _strip_protocol(cls, path):
            return super()._strip_protocol(str(path).removeprefix("countmem://"))

        def cat_file(self, path, *args, **kwargs):
            Counting.metadata_reads += str(path).endswith("/zarr.json")
            return super().cat_file(path, *args, **kwargs)

        def _open(self, path, mode="rb", *args, **kwargs):
            Counting.metadata_reads += str(path).endswith("/zarr.json") and "r" in mode
            return super()._open(path, mode, *args, **kwargs)

    fsspec.register_implementation("countmem", Counting, clobber=True)
    return Counting


@pytest.mark.parametrize("published", [10, 400])
def test_collecting_reads_the_metadata_of_unpublished_folders_only(env, published):
    """Every materialization collects first: it read the zarr.json of every version ever
    stored of the asset (a GET each in an object store), published or not, before the
    database dropped the published ones. The reads are now as many as the unpublished
    folders, whatever the published versions number."""
    import json
    import time as clock
    import uuid

    from deepx_flow.assets.gc import collect
    from deepx_flow.meta.models import AssetMaterialization
    from deepx_flow.storage.zarr_store import WRITER_ATTR

    fs_class = counting_memory_fs()
    root = f"countmem://assets-{uuid.uuid4().hex}"
    fs = fs_class()
    now = clock.time()
    me = this_process()
    versions = [uuid.uuid4().hex for _ in range(published)]
    partial = [uuid.uuid4().hex for _ in range(3)]
    for v in versions + partial:
        writer = {"host": me.host, "space": me.space, "pid": 2**22 + 1, "at": now - 10}
        fs.pipe(f"{root}/x/{v}.zarr/zarr.json", json.dumps(
            {"zarr_format": 3, "node_type": "array",
             "attributes": {WRITER_ATTR: writer, **({} if v in partial
                                                    else {"deepx_complete": True})}}).encode())
    with env.session() as s:
        for v in versions:
            s.add(AssetMaterialization(version=v, asset="x", shape="[4]", dtype="float32",
                                       storage="zarr", uri=f"{root}/x/{v}.zarr",
                                       created_at=now))
    fs_class.metadata_reads = 0
    verdicts = collect(env, ["x"], root=root, dry_run=True, now=now)
    assert fs_class.metadata_reads == len(partial)  # not published + len(partial)
    assert sorted(v.folder.version for v in verdicts) == sorted(partial)
    # Their writer (pid 2**22 + 1: above any pid_max, no process) is gone: removed.
    assert all(v.remove and "is gone" in v.why for v in verdicts), [v.why for v in verdicts]
    collect(env, ["x"], root=root, now=now)
    assert {p.rsplit("/", 1)[-1][:-5] for p in fs.ls(f"{root}/x", detail=False)} \
        == set(versions)
