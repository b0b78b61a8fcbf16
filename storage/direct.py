"""Reading Zarr v3 chunks from local files straight into the block a task needs.

Why: Zarr's own read path (an event loop, a codec pipeline, a copy into the selection) took
about 150 ms for a 64 MiB chunk that the zstd decoder alone turns out in 40-65 ms, and for
streaming work the store is the bottleneck. So arrays in the codecs deepx_flow writes or
Zarr writes by default (`bytes`, then optionally `zstd`, then optionally `crc32c`) are read
here: each chunk's stored bytes are read into a buffer (`readinto` for a file on this
machine, one request through fsspec for object stores), their CRC-32C checked,
decompressed, and copied into place. Anything else (sharding, other codecs, Zarr v2) goes
through Zarr.

Chunk files are read, not memory-mapped: a mapped file cut short while it is read (a
truncation, a full disk, a network file system) kills the process with SIGBUS at the first
page past its new end, which no `try` catches; a read just returns fewer bytes, which is
damage like any other.

The format is Zarr's, and the checks are the ones Zarr makes: a chunk whose checksum does not
match or that does not decompress to its size is `Damaged`, a chunk file that is not there
(or is a folder) is `Missing` unless fill values were asked for. A stored version's reads
also get its manifest's entries (`manifest.py`, `Layout.expected`): a chunk whose size or
CRC-32C is not the one written at its position is `Damaged` too. With the `crc32c` codec that
compares the chunk's stored checksum (which the bytes were just checked against) with the
manifest's, so it costs no second pass. `storage/verify.py` turns both into the DataError
that names the array and chunk.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from deepx_flow.kernels import recycled


NOT_HERE = ("its bytes are not the ones written at this position (a chunk of another "
            "position or version)")


class Damaged(ValueError):
    """A chunk's stored bytes are wrong: `index` is the chunk, the message says how."""

    def __init__(self, index, message: str):
        super().__init__(message)
        self.index = index


class Missing(LookupError):
    """A chunk's file is not there (with `missing="error"`): `index` is the chunk."""

    def __init__(self, index):
        super().__init__(f"chunk {tuple(index)} is missing")
        self.index = index


@dataclass(frozen=True)
class Layout:
    """What reading an array's chunks needs: where they are and how they are encoded."""

    root: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    zstd: bool
    crc32c: bool
    fill_value: object
    key: object  # the array's chunk key encoding (index -> "c/0/1")
    fs: object = None  # the fsspec file system of an object store (None: local files)
    # A stored version's manifest entries: chunk key -> (stored size, CRC-32C).
    expected: dict | None = None

    def path(self, index) -> str:
        key = self.key.encode_chunk_key(tuple(index))
        return os.path.join(self.root, key) if self.fs is None else f"{self.root}/{key}"


def layout_of(arr, uri: str | None = None, expected: dict | None = None) -> Layout | None:
    """The Layout of an open Zarr array when it can be read here, else None. Arrays in an
    object store are read here when their `uri` is given; `expected` is the manifest's
    entries of a stored version."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
    from zarr.storage import FsspecStore, LocalStore
    meta = arr.metadata
    local = isinstance(arr.store, LocalStore)
    if getattr(meta, "zarr_format", None) != 3 or not (
            local or uri is not None and isinstance(arr.store, FsspecStore)):
        return None
    codecs = list(meta.codecs)
    if not codecs or not isinstance(codecs[0], BytesCodec):
        return None
    endian = getattr(codecs[0].endian, "value", codecs[0].endian)
    if endian not in (None, sys.byteorder):
        return None
    rest = codecs[1:]
    zstd = bool(rest) and isinstance(rest[0], ZstdCodec)
    rest = rest[1:] if zstd else rest
    crc = bool(rest) and isinstance(rest[0], Crc32cCodec)
    rest = rest[1:] if crc else rest
    if rest or not hasattr(meta.chunk_grid, "chunk_shape"):
        return None
    dtype = np.dtype(arr.dtype)
    if dtype.hasobject:
        return None
    if local:
        root, fs = str(arr.store.root / arr.path) if arr.path else str(arr.store.root), None
    else:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem
        fs, root = fsspec.core.url_to_fs(uri)
        root = root.rstrip("/")
        fs = None if isinstance(fs, LocalFileSystem) else fs  # a file:// URL: local files
    return Layout(root, tuple(arr.shape), tuple(int(c) for c in meta.chunk_grid.chunk_shape),
                  dtype, zstd, crc, meta.fill_value, meta.chunk_key_encoding, fs, expected)


def chunk_region(idx, shape, grid) -> tuple[tuple[int, int], ...]:
    """(start, stop) per axis of chunk `idx` of an array of `shape` in chunks of `grid`."""
    return tuple((i * c, min((i + 1) * c, n)) for i, c, n in zip(idx, grid, shape))


def read_block(layout: Layout, region, indices, missing: str) -> np.ndarray:
    """The block `region` ((start, stop) per axis), from the chunks `indices` overlapping it;
    Missing or Damaged for a chunk that is not there (with `missing="error"`) or is bad."""
    shape = tuple(hi - lo for lo, hi in region)
    chunk_bytes = int(np.prod(layout.chunks)) * layout.dtype.itemsize
    # One chunk that is the whole block (the common case: tasks aligned to stored chunks)
    # is returned as decoded, without a copy.
    if len(indices) == 1 and tuple(map(tuple, region)) == chunk_region(
            indices[0], layout.shape, layout.chunks) and shape == tuple(layout.chunks):
        chunk = _decode(layout, indices[0], chunk_bytes, missing)
        return chunk if chunk is not None else np.full(shape, layout.fill_value, layout.dtype)
    out = recycled.empty(shape, layout.dtype)
    for index in indices:
        src, dst = [], []
        for (lo, hi), i, c in zip(region, index, layout.chunks):
            start, stop = max(lo, i * c), min(hi, (i + 1) * c)
            src.append(slice(start - i * c, stop - i * c))
            dst.append(slice(start - lo, stop - lo))
        target = out[tuple(dst)]
        # A whole chunk that lands as one contiguous run of the block (chunks that span
        # every axis but the first) is decoded in place.
        whole = all(s.stop - s.start == c for s, c in zip(src, layout.chunks))
        chunk = _decode(layout, index, chunk_bytes, missing,
                        into=target if whole and target.flags.c_contiguous else None)
        if chunk is None:
            target[...] = layout.fill_value
        elif chunk is not target:
            target[...] = chunk[tuple(src)]
    return out


def check_chunk(layout: Layout, index) -> None:
    """Read and decode chunk `index` and drop it: Missing or Damaged when it is not whole
    (`verify_array` checks a whole version this way)."""
    _decode(layout, index, int(np.prod(layout.chunks)) * layout.dtype.itemsize, "error")


def _decode(layout: Layout, index, nbytes: int, missing: str, into=None
            ) -> np.ndarray | None:
    """Chunk `index` as an array of the chunk shape (`into`, a C-contiguous array of that
    shape, when given); None for a missing file with `missing="fill"`."""
    stored = _read(layout, index, missing)
    if stored is None:
        return None
    view = memoryview(stored)
    _check(layout, index, stored)
    if layout.crc32c:
        view = view[:-4]
    out = into if into is not None else recycled.empty(layout.chunks, layout.dtype)
    flat = out.reshape(-1).view(np.uint8)
    if layout.zstd:
        size = frame_content_size(view)
        if size is not None and size != nbytes:
            raise Damaged(index, f"it decompresses to {size:,} bytes, not the {nbytes:,} of "
                                 f"a chunk")
        try:
            decoded = _zstd().decode(view, out=flat) if size is not None else \
                _zstd().decode(view)
        except Exception as err:  # numcodecs raises RuntimeError for a bad frame
            raise Damaged(index, f"it does not decompress: {err}") from None
        if size is None:  # a frame that does not say its size: decoded, then checked
            if len(decoded) != nbytes:
                raise Damaged(index, f"it decompresses to {len(decoded):,} bytes, not the "
                                     f"{nbytes:,} of a chunk")
            flat[:] = np.frombuffer(decoded, np.uint8)
    else:
        if len(view) != nbytes:
            raise Damaged(index, f"it holds {len(view):,} bytes, not the {nbytes:,} of a "
                                 f"chunk")
        flat[:] = np.frombuffer(view, np.uint8)
    return out


def _read(layout: Layout, index, missing: str) -> np.ndarray | bytes | None:
    """The stored bytes of chunk `index`; None for a missing one with `missing="fill"`.

    A local file is read into a (recycled) buffer of the size it had when opened; one cut
    short meanwhile gives fewer bytes, which is Damaged."""
    path = layout.path(index)
    try:
        if layout.fs is not None:
            return layout.fs.cat_file(path)
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            data = recycled.empty((size,), np.uint8)
            got = file.readinto(memoryview(data)) if size else 0
    except (FileNotFoundError, IsADirectoryError):  # Zarr reads a folder as the fill too
        if missing == "fill":
            return None
        raise Missing(index) from None
    if got != size:
        raise Damaged(index, f"it was cut short while it was read ({got:,} of {size:,} "
                             f"bytes)")
    return data


def _check(layout: Layout, index, stored) -> None:
    """Damaged when the stored bytes are not the ones written: a checksum that does not
    match them, or (for a stored version) not the size and CRC-32C its manifest records
    for this position. The bytes are checked against their trailer first, so comparing
    the trailer with the manifest's CRC checks the bytes themselves."""
    import google_crc32c
    want = None
    if layout.expected is not None:
        want = layout.expected.get(layout.key.encode_chunk_key(tuple(index)))
        if want is None:
            raise Damaged(index, "the manifest has no such chunk")
        if len(stored) != want[0]:
            raise Damaged(index, f"it is {len(stored):,} bytes where {want[0]:,} were "
                                 f"written")
    if layout.crc32c:
        if len(stored) < 4 or google_crc32c.value(stored[:-4]) != int.from_bytes(
                bytes(stored[-4:]), "little"):
            raise Damaged(index, "its checksum does not match its bytes (changed or "
                                 "truncated)")
        crc = int.from_bytes(bytes(stored[-4:]), "little")
    else:
        crc = google_crc32c.value(stored) if want is not None else None
    if want is not None and crc != want[1]:
        raise Damaged(index, NOT_HERE)


def frame_content_size(data) -> int | None:
    """The decompressed size a Zstandard frame's header states (RFC 8878, 3.1.1), or None
    when the header does not say it; Damaged-worthy input gives None too (the decoder then
    reports it)."""
    if len(data) < 6 or bytes(data[:4]) != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = data[4]
    single_segment = (descriptor >> 5) & 1
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    if not width or len(data) < at + width:
        return None
    size = int.from_bytes(bytes(data[at:at + width]), "little")
    return size + 256 if width == 2 else size


@lru_cache(maxsize=1)
def _zstd():
    from numcodecs import Zstd
    return Zstd()
