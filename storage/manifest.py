"""The manifest of a stored version: what was written, each chunk bound to its place.

A version's manifest (`deepx_manifest.json` beside `zarr.json`) is written when every chunk
is written, before the array is marked complete. Its format 2 records:

- `metadata`: the array's Zarr metadata as written (`zarr.json` without its attributes:
  shape, data type, chunk grid, codecs, fill value, chunk key encoding). A read compares
  the array's metadata with it, so an edited `zarr.json` (another dtype, a larger shape) is
  damage, never a reinterpretation of the stored bytes;
- `chunks`: per chunk key (its position in the grid), the stored size and the CRC-32C of the
  bytes the `crc32c` codec covers (all but its 4-byte trailer; the whole file for an array
  without the codec). With the codec, that CRC is the chunk's own trailer: the read that
  checks a chunk's bytes against its trailer (`direct.py`) binds the chunk to its position
  by comparing the trailer with the manifest's entry, without a second pass over the bytes.
  A chunk moved to another position, or copied from another version, has another CRC unless
  its bytes are the same (and then it reads the same).

The manifest's digest (BLAKE2b-128 of its bytes, `digest`) is recorded in the version's
database row, so a manifest edited, replaced or deleted is damage too. Reads of a version
are given that digest (`load`); a manifest that matched it once is kept for the process,
the `CACHED` used last (what it says stays true whatever later happens to the file; one let
go is read and checked again).

Format 1, written before this one, held the keys and sizes only; versions stored before
manifests have none. `upgrade` writes format 2 for them from the chunks as they are now.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass

NAME = "deepx_manifest.json"
FORMAT = 2
CACHED = 64  # manifests kept per process, by (uri, digest)


class Problem(ValueError):
    """What is wrong with a version's manifest or metadata (`str(err)` says it; `index` is
    the chunk when it is about one)."""

    def __init__(self, message: str, index=None):
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest: `chunks` maps chunk key -> (stored size, CRC-32C), the CRC None
    in format 1; `metadata` is None in format 1."""

    format: int
    metadata: dict | None
    chunks: dict
    digest: str

    def sizes(self) -> dict[str, int]:
        return {key: size for key, (size, _) in self.chunks.items()}


def digest(data: bytes) -> str:
    """The digest the database records for a manifest's bytes."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def metadata_of(arr) -> dict:
    """The Zarr metadata of an open array that a manifest binds: all of it but the user
    attributes (which deepx_flow writes after the manifest), as JSON gives it back."""
    meta = arr.metadata.to_dict()
    meta.pop("attributes", None)
    return json.loads(json.dumps(meta))


def has_crc_trailer(metadata: dict) -> bool:
    """Whether each stored chunk ends with the 4-byte CRC-32C of the bytes before it (the
    `crc32c` codec, last)."""
    codecs = metadata.get("codecs") or []
    return bool(codecs) and (codecs[-1] or {}).get("name") == "crc32c"


def parse(data: bytes) -> Manifest:
    """A manifest from its bytes; Problem if they are not one."""
    try:
        found = json.loads(data)
        fmt = found.get("format", 1)
        chunks = found["chunks"]
        if fmt == 1:
            entries = {str(k): (int(v), None) for k, v in chunks.items()}
        else:
            entries = {str(k): (int(v[0]), int(v[1])) for k, v in chunks.items()}
        metadata = found.get("metadata") if fmt >= 2 else None
        if fmt >= 2 and not isinstance(metadata, dict):
            raise ValueError("no metadata")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        raise Problem(f"has a manifest ({NAME}) that is not readable: "
                      f"{type(err).__name__}: {err}") from None
    return Manifest(fmt, metadata, entries, digest(data))


def _path(root: str) -> str:
    return f"{root.rstrip('/')}/{NAME}"


def stored(fs, root: str) -> bytes | None:
    """The bytes of the array's manifest as stored now; None when it has none."""
    try:
        return fs.cat_file(_path(root))
    except FileNotFoundError:
        return None


def read(fs, root: str) -> Manifest | None:
    """The array's manifest as stored now (not cached); None when it has none."""
    data = stored(fs, root)
    return None if data is None else parse(data)


_cache: OrderedDict = OrderedDict()
_lock = threading.Lock()


def load(fs, root: str, expected: str) -> Manifest:
    """The manifest whose digest the version's row records (`expected`); Problem when it is
    missing or another one. Kept for the process once it matched."""
    key = (root, expected)
    with _lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    found = bound(fs, root, expected)
    with _lock:
        _cache[key] = found
        while len(_cache) > CACHED:
            _cache.popitem(last=False)
    return found


def bound(fs, root: str, expected: str) -> Manifest:
    """`load` without the cache: the manifest as stored now, checked against `expected`."""
    found = read(fs, root)
    if found is None:
        raise Problem(f"has lost its manifest ({NAME}), which says what was written")
    if found.digest != expected:
        raise Problem(f"has a manifest ({NAME}) other than the one written (digest "
                      f"{found.digest[:12]} where {expected[:12]} was recorded): edited or "
                      f"replaced")
    if found.format < 2:  # (its digest was recorded: not one deepx_flow wrote)
        raise Problem(f"has a manifest ({NAME}) of format {found.format}, which binds no "
                      f"chunk to its position")
    return found


def metadata_problem(arr, manifest: Manifest) -> str | None:
    """What differs between the array's Zarr metadata and what the manifest says was
    written (None when they agree, or the manifest records none)."""
    if manifest.metadata is None or _same_fields(arr.metadata, manifest):
        return None
    now = metadata_of(arr)
    if now == manifest.metadata:
        return None
    keys = sorted(set(now) | set(manifest.metadata), key=str)
    diffs = [f"{k} {_short(now.get(k))} where {_short(manifest.metadata.get(k))} was "
             f"written" for k in keys if now.get(k) != manifest.metadata.get(k)]
    return f"has metadata (zarr.json) other than was written: {'; '.join(diffs)}"


def _same_fields(meta, manifest: Manifest) -> bool:
    """Whether the parsed metadata `meta` has, attributes aside, the fields of the
    manifest's, parsed once per manifest: a few microseconds, where `metadata_of` takes a
    tenth of a millisecond, which every read task would pay. False says "compare them as
    JSON" (a NaN fill value is not equal to itself here)."""
    import dataclasses
    expected = _parsed(manifest)
    if expected is None or type(meta) is not type(expected):
        return False
    return all(getattr(meta, f.name) == getattr(expected, f.name)
               for f in dataclasses.fields(meta) if f.name != "attributes")


_parsed_cache: OrderedDict = OrderedDict()


def _parsed(manifest: Manifest):
    """The manifest's metadata as Zarr parses it (None where it does not)."""
    with _lock:
        if manifest.digest in _parsed_cache:
            return _parsed_cache[manifest.digest]
    from zarr.core.metadata.v3 import ArrayV3Metadata
    try:
        parsed = ArrayV3Metadata.from_dict({**manifest.metadata, "attributes": {}})
    except Exception:  # not what Zarr reads: compared as JSON
        parsed = None
    with _lock:
        _parsed_cache[manifest.digest] = parsed
        while len(_parsed_cache) > CACHED:
            _parsed_cache.popitem(last=False)
    return parsed


def _short(value) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 80 else text[:77] + "..."


def crcs(fs, root: str, keys: list[str], sizes: dict[str, int], trailer: bool) -> dict:
    """Key -> the CRC-32C a manifest records for each chunk as stored now: its trailer, or
    (without the codec) the CRC of the whole file, which means reading it. Problem for a
    chunk too short to hold a trailer."""
    paths = [f"{root.rstrip('/')}/{k}" for k in keys]
    if trailer:
        short = [k for k in keys if sizes[k] < 4]
        if short:
            raise Problem(f"is {sizes[short[0]]} bytes, too short for its checksum",
                          index=short[0])
        tails = fs.cat_ranges(paths, [sizes[k] - 4 for k in keys], [sizes[k] for k in keys])
        for k, tail in zip(keys, tails):
            if isinstance(tail, FileNotFoundError):  # gone since it was listed
                raise Problem("is missing (deleted while it was checked)", index=k)
            if isinstance(tail, Exception):  # not the data: a permission, the network
                raise tail
            if len(tail) != 4:  # cut since it was listed
                raise Problem("changed while it was read", index=k)
        return {k: int.from_bytes(t, "little") for k, t in zip(keys, tails)}
    import google_crc32c
    found = {}
    for k, p in zip(keys, paths):
        try:
            found[k] = google_crc32c.value(fs.cat_file(p))
        except FileNotFoundError:  # gone since it was listed (another OSError: not the data)
            raise Problem("is missing (deleted while it was checked)", index=k) from None
    return found


def write(fs, root: str, arr, sizes: dict[str, int], keys: list[str]) -> str:
    """Write the format-2 manifest of the chunks `keys` (whose stored sizes are `sizes`) of
    the open array `arr` at `root`; return its digest. The bytes are the same for the same
    array and chunks, so two processes upgrading one version at once write the same."""
    metadata = metadata_of(arr)
    sums = crcs(fs, root, keys, sizes, has_crc_trailer(metadata))
    data = json.dumps({"format": FORMAT, "checksum": "crc32c", "metadata": metadata,
                       "chunks": {k: [sizes[k], sums[k]] for k in keys}},
                      sort_keys=True, separators=(",", ":")).encode()
    _put(fs, _path(root), data)
    return digest(data)


def _put(fs, path: str, data: bytes) -> None:
    """Write a file whole: on a local disk under a temporary name, then renamed over the
    old one (an upgrade replaces a manifest readers may be reading); object stores write
    an object whole anyway."""
    from fsspec.implementations.local import LocalFileSystem
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    temporary = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new"
    try:
        with open(temporary, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


__all__ = ["NAME", "FORMAT", "Manifest", "Problem", "digest", "metadata_of", "parse", "stored",
           "read", "load", "bound", "metadata_problem", "crcs", "write", "has_crc_trailer"]
