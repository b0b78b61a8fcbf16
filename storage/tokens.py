"""What identifies the data stored at a path or URL: a token from a listing, never the data.

Task keys are content addresses (`compiler/lower.py`): a run whose keys are those of chunks
the cluster still holds (a `dx.persist` not yet released) takes those chunks instead of
computing them again. So the token of a file or Zarr array that a run reads must change
whenever its data does. The path alone does not (a `read_zarr` node was keyed by it), nor
does a Zarr folder's own size and time, which stay the same when a chunk file in it is
rewritten: both gave a later run the results computed from the earlier data.

`data_token` follows one rule for every way an array is read (an input given as a path, a
`zarr.Array` in local files, a `read_zarr` node):

- A local file (`.npy`) is named by its device, inode, size, and modification and change
  times (nanoseconds); a local Zarr array by the same of every file under its folder
  (`zarr.json`, each chunk, the manifest), with their names. That is a listing and a `stat`
  per file. The change time cannot be set back by anyone (`touch -d`, `cp -p` and `rsync -t`
  set the modification time only), and a file replaced by a rename has another inode.
- A file changed within the last `RACY_SECONDS` gets a token of its own, used once: a file
  system's clock ticks coarsely (a few milliseconds on Linux, seconds on some), and a file
  rewritten at the same size within the tick its time was read in keeps the same times (the
  "racily clean" entries of Git's index). Such data is read again by every run until it has
  been still for that long.
- An object store is named by each object's name and size and the marker of its content
  or write that the store lists (an ETag, a generation, an MD5 or CRC-32C, a version id).
  Where an object has none (a time alone, which may tick in seconds and comes from another
  clock, or nothing: fsspec's memory file system), the token is one of its own.
- What cannot be listed gets a token of its own too; the read then reports the problem.

A stored asset version is not listed: it is never written again after its row is recorded,
and its reads carry its manifest's digest, which binds every chunk (`manifest.py`), so the
digest names its data (the lowering keys it by its attributes).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

RACY_SECONDS = 2.0  # a file changed this recently may change again without a new time
# What object stores list that changes with an object's content or each write of it
# (s3fs, gcsfs, adlfs and others): any one is enough.
CONTENT_MARKERS = ("ETag", "etag", "generation", "md5Hash", "crc32c", "VersionId",
                   "version_id", "content_md5")


def data_token(uri: str) -> str:
    """A token of the data at `uri` (a local path, a `file://` URL or any fsspec URL), from
    a listing of its files; see the module docstring for the rule. Never raises: what
    cannot be listed gets a token of its own."""
    uri = str(uri)
    try:
        if "://" not in uri or uri.startswith("file://"):
            listing = _local(uri[len("file://"):] if uri.startswith("file://") else uri)
        else:
            listing = _remote(uri)
    except (OSError, ValueError, ImportError):  # gone, unreadable, no such protocol
        listing = None
    if listing is None:
        return "once-" + uuid.uuid4().hex
    return hashlib.blake2b(repr((uri, listing)).encode(), digest_size=16).hexdigest()


def _local(path: str) -> list | None:
    """(name, device, inode, size, mtime_ns, ctime_ns) of the file at `path`, or of every
    file under the folder at `path` (named by its path below it); None when one changed too
    recently to be told apart from a change to come."""
    stat = os.stat(path)
    entries = local_files(path) if os.path.isdir(path) else [("", stat)]
    racy = time.time_ns() - int(RACY_SECONDS * 1e9)
    listing = []
    for name, s in entries:
        if s.st_mtime_ns > racy or s.st_ctime_ns > racy:
            return None
        listing.append((name, s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns))
    listing.sort()
    return listing


def local_files(folder: str) -> list[tuple[str, os.stat_result]]:
    """(path below `folder` with "/" between its parts, stat) of every file under `folder`,
    following links as a read would (a link to nothing, or a file or folder gone since its
    folder was read, is left out). A folder that cannot be read raises its OSError (left
    out, its files would look deleted), as does `folder` itself not being there."""
    cut = len(folder.rstrip(os.sep)) + 1
    found, stack = [], [folder]
    while stack:
        below = stack.pop()
        try:
            entries = os.scandir(below)
        except FileNotFoundError:
            if below == folder:
                raise
            continue  # removed since its parent was read
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir():
                        stack.append(entry.path)
                    else:
                        found.append((entry.path[cut:].replace(os.sep, "/"), entry.stat()))
                except FileNotFoundError:
                    pass
    return found


def _remote(uri: str) -> list | None:
    """(name, size, content marker) of every object at `uri`, listed now; None when an
    object lists no marker of its content."""
    import fsspec
    fs, root = fsspec.core.url_to_fs(uri)
    fs.invalidate_cache(root)  # a listing kept from before would be the old data's
    found = fs.find(root, detail=True)
    listing = []
    for name in sorted(found):
        info = found[name]
        marker = next((str(info[k]) for k in CONTENT_MARKERS if info.get(k)), None)
        if marker is None:
            return None
        listing.append((name, info.get("size"), marker))
    return listing


__all__ = ["data_token", "local_files", "RACY_SECONDS"]
