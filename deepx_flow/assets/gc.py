"""Collecting what killed writes left: version folders under the asset root that no row
publishes and that nothing is writing any more.

A version is written data first, row last (`materialize.py`, `train/checkpoint.py`): its
folder `<asset root>/<asset>/[<partition>/]<version>.zarr` exists from the start of the
write, and the row that makes it visible is added once every chunk is there. A write that
fails deletes its folder; a driver killed outright (SIGKILL, the OOM killer, a lost machine)
cannot, and its partial folder was never read nor deleted by anything. These are collected
at the next materialization of the asset (and when a training with checkpoints starts, once
for its checkpoint asset: `train.book.Saver`), and by `deepx-flow assets gc`.

What is collected is decided by `judge` (pure) from what the folder, the database and this
host say. A folder is a candidate when its version has no row and its write did not finish
(no completion marker: `zarr_store.is_complete`); a complete folder without a row (a
driver killed between its last chunk and its row, or a version of another database sharing
the asset root) is kept and reported, to be removed by hand. The array's attributes name
its writer, the process that created it (`zarr_store.WRITER_ATTR`: host, pid, time):
- a writer on this host: kept while that process runs (`meta.orphans.driver_gone`, which
  tells a reused pid); removed once it is gone, since nothing finishes the write then;
- a writer on another host, whose processes this host cannot see: kept while the database
  has a run of that process `running` (runs of a driver that died there are marked
  interrupted by the next process on that host, `meta.orphans`), and while the folder is
  younger than the grace period (`DEEPX_GC_GRACE_S`, 1 hour): a run's row is written just
  after its folder is made; removed after that;
- no writer recorded (a folder from before writers were recorded, or one whose metadata is
  not written yet): removed once older than the grace period, by the folder's time.

The order of the look-ups keeps a version being published from being taken: the folders
are listed, then the runs read and the writers' processes looked at, and only then the rows
read: a writer found gone cannot publish after that, and a run publishes before it ends.
Published versions are never deleted: nothing in deepx_flow expires a version (there is no
retention policy).
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from sqlmodel import col, select

from deepx_flow.meta.models import AssetMaterialization, Run
from deepx_flow.meta.orphans import driver_gone, process_started

log = logging.getLogger(__name__)

VERSION_FOLDER = re.compile(r"^[0-9a-f]{32}\.zarr$")  # a uuid4 hex, as versions are named


@dataclass(frozen=True)
class Folder:
    """A version folder under the asset root, and what it says of itself."""

    uri: str  # where it is (a local path or an fsspec URL)
    asset: str
    version: str
    complete: bool  # every chunk was written (its completion marker is set)
    writer: dict | None  # WRITER_ATTR: host, pid, at; None when not recorded
    age: float | None  # seconds since it was made; None when unknown

    @property
    def writer_name(self) -> str:
        return f"{self.writer['host']}:{self.writer['pid']}" if self.writer else "unknown"


@dataclass(frozen=True)
class Verdict:
    """Whether a folder is removed, and why (kept or removed)."""

    folder: Folder
    remove: bool
    why: str


def judge(folder: Folder, *, host: str, writer_gone: bool | None, running_run: str | None,
          grace_s: float) -> Verdict:
    """Remove `folder`, a version folder no row publishes, or keep it (see the module
    docstring). `writer_gone` says whether its writer's process is gone (None: the writer is
    not on this `host`, or not recorded); `running_run` is a run of its writer that the
    database has `running` (None: none)."""
    if folder.complete:
        return Verdict(folder, False, "complete, but no row of this database publishes it "
                                      "(another database's version, or a write killed "
                                      "before its row); remove it by hand if it is neither")
    writer = folder.writer
    if writer is not None and writer["host"] == host and writer_gone is not None:
        if not writer_gone:
            return Verdict(folder, False, f"being written: its writer {folder.writer_name} "
                                          f"is running")
        return Verdict(folder, True, f"partial: its writer {folder.writer_name} is gone")
    if running_run is not None:
        return Verdict(folder, False, f"being written: run {running_run[:12]} of its writer "
                                      f"{folder.writer_name} is running")
    if folder.age is None:
        return Verdict(folder, False, "partial, but its age is unknown")
    if folder.age < grace_s:
        return Verdict(folder, False, f"partial, {folder.age:.0f} s old, its writer "
                                      f"{folder.writer_name} not seen from this host: kept "
                                      f"for the grace period of {grace_s:g} s "
                                      f"(DEEPX_GC_GRACE_S)")
    return Verdict(folder, True, f"partial, {folder.age:.0f} s old, its writer "
                                 f"{folder.writer_name} has no run running")


def collect(db, assets: list[str] | None = None, *, dry_run: bool = False,
            root: str | None = None, now: float | None = None,
            started: Callable[[int], float | None] = process_started) -> list[Verdict]:
    """Remove the partial version folders of `assets` (default: every asset under the asset
    root, or `root`) that nothing writes any more. Returns the verdict on each version
    folder that no row publishes; with `dry_run`, what would be removed, and nothing is. A
    folder that cannot be removed is a RuntimeWarning and a verdict that says so."""
    from deepx_flow.assets.materialize import asset_root
    from deepx_flow.config import settings
    from deepx_flow.storage.zarr_store import delete_array

    grace = settings().gc_grace_s
    now = time.time() if now is None else now
    folders = _folders(root or asset_root(), assets, now)
    # Published versions need no more look-ups; the rest are looked up again last.
    early = _published(db, [f.version for f in folders]) if folders else set()
    folders = [f for f in folders if f.version not in early]
    if not folders:
        return []
    host = socket.gethostname()
    running = _running_runs(db, {_writer_key(f) for f in folders
                                 if f.writer is not None and f.writer["host"] != host})
    gone = {f.uri: driver_gone(f.writer["pid"], f.writer["at"], started)
            for f in folders if f.writer is not None and f.writer["host"] == host}
    published = _published(db, [f.version for f in folders])  # last: see the docstring
    verdicts = [judge(f, host=host, writer_gone=gone.get(f.uri),
                      running_run=running.get(_writer_key(f)), grace_s=grace)
                for f in folders if f.version not in published]
    if dry_run:
        return verdicts
    done = [_remove(v, delete_array) if v.remove else v for v in verdicts]
    removed = [v.folder.uri for v in done if v.remove]
    if removed:
        log.info("deepx_flow: removed %d partial version folder(s): %s", len(removed),
                 ", ".join(removed))
    return done


def collect_before_writing(db, assets: list[str]) -> None:
    """`collect` what killed writes of `assets` left, before a new version of them is
    written. A failure to look is a warning: it leaves garbage, never a wrong version."""
    try:
        collect(db, assets)
    except Exception as err:  # noqa: BLE001 (storage or database trouble: say it, go on)
        warnings.warn(f"could not look for partial version folders of "
                      f"{', '.join(assets)}: {type(err).__name__}: {err}", RuntimeWarning,
                      stacklevel=3)


def _remove(verdict: Verdict, delete) -> Verdict:
    try:
        delete(verdict.folder.uri)
    except Exception as err:  # noqa: BLE001 (any storage failure: say it, go on)
        message = f"could not be removed: {type(err).__name__}: {err}"
        warnings.warn(f"the partial version folder {verdict.folder.uri} {message}",
                      RuntimeWarning, stacklevel=3)
        return Verdict(verdict.folder, False, message)
    return verdict


def _writer_key(folder: Folder) -> tuple | None:
    return (folder.writer["host"], folder.writer["pid"]) if folder.writer else None


def _folders(root: str, assets, now: float) -> list[Folder]:
    """The version folders under `root` of `assets` (all when None), each with what its
    array's metadata says (nothing when it cannot be read)."""
    import fsspec

    from deepx_flow.storage.zarr_store import normalize_uri

    root = normalize_uri(root).rstrip("/")
    fs, base = fsspec.core.url_to_fs(root)
    base = base.rstrip("/")
    names = assets if assets is not None else [_name(p) for p in _dirs(fs, base)]
    found = []
    for asset in sorted(set(names)):
        for path in _dirs(fs, f"{base}/{asset}"):
            if VERSION_FOLDER.match(_name(path)):
                inside = [path]
            else:  # a partition's folder
                inside = [p for p in _dirs(fs, path) if VERSION_FOLDER.match(_name(p))]
            # Local paths are their own URIs; URLs get their protocol back.
            found += [_folder(fs, p, root + p[len(base):] if "://" in root else p, asset,
                              now) for p in inside]
    return found


def _dirs(fs, path: str) -> list[str]:
    try:
        return sorted(e["name"].rstrip("/") for e in fs.ls(path, detail=True)
                      if e.get("type") == "directory")
    except FileNotFoundError:  # removed meanwhile
        return []


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _folder(fs, path: str, uri: str, asset: str, now: float) -> Folder:
    from deepx_flow.storage.zarr_store import COMPLETE_ATTR, WRITER_ATTR

    try:
        attrs = json.loads(fs.cat_file(f"{path}/zarr.json")).get("attributes") or {}
    except (OSError, ValueError, AttributeError):  # not there yet, or not an array's
        attrs = {}
    writer = attrs.get(WRITER_ATTR)
    if not (isinstance(writer, dict) and isinstance(writer.get("host"), str)
            and isinstance(writer.get("pid"), int)
            and isinstance(writer.get("at"), (int, float))):
        writer = None
    if writer is not None:
        made = writer["at"]
    else:
        try:
            made = fs.modified(path).timestamp()
        except (OSError, NotImplementedError, ValueError):
            made = None
    return Folder(uri, asset, _name(path)[:-len(".zarr")], attrs.get(COMPLETE_ATTR) is True,
                  writer, None if made is None else max(0.0, now - made))


def _published(db, versions: list[str]) -> set[str]:
    out: set[str] = set()
    with db.read() as session:
        for at in range(0, len(versions), 500):  # bounded IN lists
            out.update(session.exec(select(AssetMaterialization.version).where(
                col(AssetMaterialization.version).in_(versions[at:at + 500]))))
    return out


def _running_runs(db, writers: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """(host, pid) -> a run of that process the database has `running`."""
    if not writers:
        return {}
    hosts = sorted({h for h, _ in writers})
    with db.read() as session:
        rows = session.exec(select(Run.host, Run.pid, Run.id).where(
            Run.status == "running", col(Run.host).in_(hosts))).all()
    return {(h, p): run_id for h, p, run_id in rows if (h, p) in writers}


__all__ = ["collect", "collect_before_writing", "judge", "Folder", "Verdict"]
