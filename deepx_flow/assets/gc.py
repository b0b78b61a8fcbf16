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
process say. A folder is a candidate when its version has no row and its write did not
finish (no completion marker: `zarr_store.is_complete`); a complete folder without a row (a
driver killed between its last chunk and its row, or a version of another database sharing
the asset root) is kept and reported, to be removed by hand. The array's attributes name
its writer, the process that created it (`zarr_store.WRITER_ATTR`: host, PID space, pid,
time):
- a writer this process can look up by pid (`processes.can_look_up`: the same host name,
  boot of the kernel and PID namespace): kept while that process runs
  (`meta.orphans.driver_gone`, which tells a reused pid); removed once it is gone, since
  nothing finishes the write then;
- any other writer, whose process cannot be seen from here (another host; a container of
  the same host name with its own PID namespace; another machine of the same name sharing
  the asset root; a folder written before writers recorded their PID space): kept while
  the database has a run of that process `running` (runs of a driver that died are marked
  interrupted by the next process that can see it, `meta.orphans`), and while the folder is
  younger than the grace period (`DEEPX_GC_GRACE_S`, 1 hour): a run's row is written just
  after its folder is made; removed after that;
- no writer recorded (a folder from before writers were recorded, or one whose metadata is
  not written yet): removed once older than the grace period, by the folder's time.

What it costs does not grow with the versions published: the folders' names are listed
(one listing per asset and partition), the database drops the versions it publishes, and
only the rest have their metadata read (one read each, of `zarr.json`).

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
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from sqlmodel import col, select

from deepx_flow.meta.models import AssetMaterialization, Run
from deepx_flow.meta.orphans import driver_gone, process_started
from deepx_flow.processes import Process, can_look_up, this_process

log = logging.getLogger(__name__)

VERSION_FOLDER = re.compile(r"^[0-9a-f]{32}\.zarr$")  # a uuid4 hex, as versions are named


@dataclass(frozen=True)
class Folder:
    """A version folder under the asset root, and what it says of itself."""

    uri: str  # where it is (a local path or an fsspec URL)
    asset: str
    version: str
    complete: bool  # every chunk was written (its completion marker is set)
    writer: dict | None  # WRITER_ATTR: host, space, pid, at; None when not recorded
    age: float | None  # seconds since it was made; None when unknown

    @property
    def writer_name(self) -> str:
        return f"{self.writer['host']}:{self.writer['pid']}" if self.writer else "unknown"

    @property
    def writer_process(self) -> Process | None:
        """Its writer's identity (its space None when not recorded: it matches none)."""
        if self.writer is None:
            return None
        return Process(self.writer["host"], self.writer.get("space"), self.writer["pid"])


@dataclass(frozen=True)
class Verdict:
    """Whether a folder is removed, and why (kept or removed)."""

    folder: Folder
    remove: bool
    why: str


def judge(folder: Folder, *, me: Process, writer_gone: bool | None, running_run: str | None,
          grace_s: float) -> Verdict:
    """Remove `folder`, a version folder no row publishes, or keep it (see the module
    docstring), as process `me` sees it. `writer_gone` says whether its writer's process is
    gone, looked up by pid (None: not looked up, as for a writer `me` cannot see);
    `running_run` is a run of its writer that the database has `running` (None: none)."""
    if folder.complete:
        return Verdict(folder, False, "complete, but no row of this database publishes it "
                                      "(another database's version, or a write killed "
                                      "before its row); remove it by hand if it is neither")
    writer = folder.writer_process
    if writer is not None and writer_gone is not None and can_look_up(writer, me):
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
                                      f"{folder.writer_name} not seen from this process "
                                      f"(another host, boot or PID namespace): kept for the "
                                      f"grace period of {grace_s:g} s (DEEPX_GC_GRACE_S)")
    return Verdict(folder, True, f"partial, {folder.age:.0f} s old, its writer "
                                 f"{folder.writer_name} has no run running")


def collect(db, assets: list[str] | None = None, *, dry_run: bool = False,
            root: str | None = None, now: float | None = None,
            started: Callable[[int], float | None] = process_started) -> list[Verdict]:
    """Remove the partial version folders of `assets` (default: every asset under the asset
    root, or `root`) that nothing writes any more. Returns the verdict on each version
    folder that no row publishes; with `dry_run`, what would be removed, and nothing is. A
    folder that cannot be removed is a RuntimeWarning and a verdict that says so."""
    from deepx_flow.assets.root import asset_root
    from deepx_flow.config import settings
    from deepx_flow.storage.zarr_store import delete_array

    grace = settings().gc_grace_s
    now = time.time() if now is None else now
    fs, listed = _listed(root or asset_root(), assets)
    # Published versions need no more look-ups, not even their metadata; the rest are looked
    # up again last.
    early = _published(db, [v.version for v in listed]) if listed else set()
    folders = [_folder(fs, v, now) for v in listed if v.version not in early]
    if not folders:
        return []
    me = this_process()
    seen = {f.uri for f in folders if f.writer is not None
            and can_look_up(f.writer_process, me)}
    running = _running_runs(db, {f.writer_process for f in folders
                                 if f.writer is not None and f.uri not in seen})
    gone = {f.uri: driver_gone(f.writer["pid"], f.writer["at"], started)
            for f in folders if f.uri in seen}
    published = _published(db, [f.version for f in folders])  # last: see the docstring
    verdicts = [judge(f, me=me, writer_gone=gone.get(f.uri),
                      running_run=running.get(f.writer_process), grace_s=grace)
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


@dataclass(frozen=True)
class _Listed:
    """A version folder found by listing, before anything in it is read."""

    path: str  # in the filesystem's terms
    uri: str  # as the rows and the verdicts name it
    asset: str
    version: str


def _listed(root: str, assets) -> tuple:
    """The filesystem of `root`, and the version folders under it of `assets` (all when
    None), by their names alone: nothing in them is read."""
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
            found += [_Listed(p, root + p[len(base):] if "://" in root else p, asset,
                              _name(p)[:-len(".zarr")]) for p in inside]
    return fs, found


def _dirs(fs, path: str) -> list[str]:
    try:
        return sorted(e["name"].rstrip("/") for e in fs.ls(path, detail=True)
                      if e.get("type") == "directory")
    except FileNotFoundError:  # removed meanwhile
        return []


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _folder(fs, listed: _Listed, now: float) -> Folder:
    """What the folder says of itself: its array's metadata (one read), nothing when it
    cannot be read."""
    from deepx_flow.storage.zarr_store import COMPLETE_ATTR, WRITER_ATTR

    path = listed.path
    try:
        attrs = json.loads(fs.cat_file(f"{path}/zarr.json")).get("attributes") or {}
    except (OSError, ValueError, AttributeError):  # not there yet, or not an array's
        attrs = {}
    writer = attrs.get(WRITER_ATTR)
    if not (isinstance(writer, dict) and isinstance(writer.get("host"), str)
            and isinstance(writer.get("pid"), int)
            and isinstance(writer.get("at"), (int, float))
            and isinstance(writer.get("space"), (str, type(None)))):
        writer = None
    if writer is not None:
        made = writer["at"]
    else:
        try:
            made = fs.modified(path).timestamp()
        except (OSError, NotImplementedError, ValueError):
            made = None
    return Folder(listed.uri, listed.asset, listed.version, attrs.get(COMPLETE_ATTR) is True,
                  writer, None if made is None else max(0.0, now - made))


def _published(db, versions: list[str]) -> set[str]:
    out: set[str] = set()
    with db.read() as session:
        for at in range(0, len(versions), 500):  # bounded IN lists
            out.update(session.exec(select(AssetMaterialization.version).where(
                col(AssetMaterialization.version).in_(versions[at:at + 500]))))
    return out


def _running_runs(db, writers: set[Process]) -> dict[Process, str]:
    """Writer -> a run of that process the database has `running`: of its host and pid, in
    its PID space when both record one (a run or a writer that records none may be it)."""
    if not writers:
        return {}
    hosts = sorted({w.host for w in writers})
    with db.read() as session:
        rows = session.exec(select(Run.host, Run.pid, Run.pid_space, Run.id).where(
            Run.status == "running", col(Run.host).in_(hosts))).all()
    found = {}
    for w in writers:
        for host, pid, space, run_id in rows:
            if (host, pid) == (w.host, w.pid) and (None in (space, w.space) or space == w.space):
                found[w] = run_id
                break
    return found


__all__ = ["collect", "collect_before_writing", "judge", "Folder", "Verdict"]
