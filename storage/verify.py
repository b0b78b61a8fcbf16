"""Checked chunks: every chunk a stored version wrote is there, whole and unchanged when read.

Zarr reads a chunk that is not there as the array's fill value, and its default codecs keep no
checksum, so a deleted chunk reads as zeros and a flipped byte as a wrong value. deepx_flow
writes its arrays so that both are caught, with what Zarr v3 gives:

- a `crc32c` codec after compression (`ARRAY_CODECS`): each chunk carries the checksum of its
  bytes, which Zarr checks as it decodes the chunk, so a flipped byte, a truncated chunk or an
  emptied one fails to decode;
- every chunk written, empty ones too (`WRITE_CONFIG`): a chunk that is not there was lost,
  never skipped;
- a manifest written when the version is complete (`deepx_manifest.json` beside `zarr.json`):
  the key and stored size of each chunk, so a version can be checked from a listing alone.

`read_region` reads a region with its chunks checked: a chunk the region needs that is not
there raises DataError (unless `missing="fill"`, for arrays written by tools that skip empty
chunks), and so does a chunk that fails to decode; the error names the chunk. `verify_array`
checks a whole stored array without computing anything: the listing against the manifest,
then (`deep`) every chunk decoded.
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from deepx_flow.errors import DataError, ExecutionError
from deepx_flow.storage import direct
from deepx_flow.storage.direct import chunk_region

MANIFEST = "deepx_manifest.json"
WRITE_CONFIG = {"write_empty_chunks": True}
FILL_HINT = ("; if the array was written without its empty chunks, read it in the graph "
             "with dx.read_zarr(path, missing='fill') (in YAML: op read_zarr, attrs "
             "{missing: fill})")
# A version without a manifest was written before deepx_flow kept one, when chunks equal to
# the fill value were not written: one that is not there may have been empty, or lost.
LEGACY_MISSING = ("is not stored, and this version has no manifest to say whether it was "
                  "written (older versions skipped chunks equal to the fill value): it may "
                  "have been empty, or lost")
VERIFY_THREADS = 8  # chunks decoded at once by `verify_array` (I/O bound)


def array_codecs() -> dict:
    """`zarr.create_array` arguments for checked chunks: Zstandard, then a CRC-32C of the
    compressed bytes (the checksum must come last to cover what is stored)."""
    from zarr.codecs import Crc32cCodec, ZstdCodec
    return {"compressors": [ZstdCodec(level=0), Crc32cCodec()]}


def describe(uri: str, origin: dict | None = None) -> str:
    """'asset features partition 2026-01-01 version 1a2b3c4d5e6f' for a stored asset
    version (`origin`: its asset, version and partition), else 'Zarr array URI'."""
    if origin and origin.get("asset"):
        partition = f" partition {origin['partition']}" if origin.get("partition") else ""
        return f"asset {origin['asset']}{partition} version {str(origin.get('version'))[:12]}"
    return f"Zarr array {uri}"


def _fs(uri: str):
    import fsspec
    return fsspec.core.url_to_fs(uri)


def _grid(arr) -> tuple[int, ...]:
    """The shape of the array's stored objects (its shards when sharded, else its chunks)."""
    return tuple(int(c) for c in arr.metadata.chunk_grid.chunk_shape)


def chunk_indices(shape, grid, region=None) -> list[tuple[int, ...]]:
    """The indices (C order) of the stored chunks of grid `grid` that `region` ((start,
    stop) per axis; default the whole array of `shape`) overlaps."""
    region = region if region is not None else tuple((0, n) for n in shape)
    ranges = [range(lo // c, -(-hi // c)) if hi > lo else range(0)
              for (lo, hi), c in zip(region, grid)]
    return list(itertools.product(*ranges))


def _error(uri, origin, idx, what: str) -> DataError:
    origin = origin or {}
    todo = (f"; materialize {origin['asset']} again to replace it" if origin.get("asset")
            else "")
    problem = f"chunk {tuple(idx)} {what}" if idx is not None else f"the array {what}"
    return DataError(f"{describe(uri, origin)}: {problem} ({uri}){todo}", uri=uri,
                     chunk=None if idx is None else tuple(idx), problem=problem,
                     asset=origin.get("asset"),
                     version=origin.get("version"), partition=origin.get("partition"))


def _open(uri: str, origin):
    from deepx_flow.storage.zarr_bfloat16 import zarr
    try:
        return zarr.open_array(uri, mode="r")
    except Exception as err:  # zarr raises several types for a missing or unreadable store
        raise _error(uri, origin, None, f"cannot be opened: {type(err).__name__}: {err}") \
            from None


def read_region(uri: str, region, missing: str = "error", origin: dict | None = None
                ) -> np.ndarray:
    """The block `region` ((start, stop) per axis) of the Zarr array at `uri`, its chunks
    checked: DataError for a chunk that is not there (with `missing="error"`) or that does
    not decode (a checksum that does not match, a truncated chunk)."""
    arr = _open(uri, origin)
    shape, grid = tuple(arr.shape), _grid(arr)
    indices = chunk_indices(shape, grid, region)
    layout = direct.layout_of(arr)
    if layout is not None:  # chunks in local files: read without Zarr's pipeline
        try:
            return direct.read_block(layout, region, indices, missing)
        except direct.Missing as err:
            raise _error(uri, origin, err.index, "is missing (deleted, or never written)"
                         + ("" if (origin or {}).get("asset") else FILL_HINT)) from None
        except direct.Damaged as err:
            raise _error(uri, origin, err.index, f"is damaged: {err}") from err
    if missing == "error" and indices:
        fs, root = _fs(uri)
        for idx in indices:
            # A file: Zarr reads a folder in a chunk's place as the fill value too.
            if not fs.isfile(f"{root}/{arr.metadata.encode_chunk_key(idx)}"):
                raise _error(uri, origin, idx, "is missing (deleted, or never written)"
                             + ("" if (origin or {}).get("asset") else FILL_HINT))
    try:
        return np.asarray(arr[tuple(slice(lo, hi) for lo, hi in region)])
    except Exception as err:
        if not is_damage(err):
            raise  # not the data: an I/O failure (a permission, the network) as it is
        bad = _first_undecodable(arr, shape, grid, indices)
        if bad is None:
            raise
        idx, cause = bad
        raise _error(uri, origin, idx, f"is damaged: {_cause(cause)}") from err


def is_damage(err: BaseException) -> bool:
    """Whether `err`, raised while decoding a chunk, says the stored bytes are wrong (a
    checksum that does not match, bytes that do not decompress or are of the wrong size),
    rather than that reading them failed (an OSError: a permission, the network, a timeout),
    which is reported as it is and never taken for damage."""
    if isinstance(err, (OSError, MemoryError)):
        return False
    text = f"{type(err).__name__}: {err}".lower()
    return isinstance(err, ValueError) or any(word in text for word in (
        "checksum", "decompress", "compress", "frame", "corrupt", "truncat"))


def _cause(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    if "checksum" in text.lower():
        return "its checksum does not match its bytes (changed or truncated)"
    return text if len(text) <= 200 else text[:200] + "..."


def _first_undecodable(arr, shape, grid, indices):
    """(index, error) of the first chunk of `indices` that does not decode because its
    bytes are damaged, or None (an error of another kind propagates)."""
    for idx in indices:
        try:
            arr[tuple(slice(lo, hi) for lo, hi in chunk_region(idx, shape, grid))]
        except Exception as err:
            if not is_damage(err):
                raise
            return idx, err
    return None


# -- a whole stored array -------------------------------------------------------------------

def write_manifest(uri: str) -> dict:
    """Record the chunks the array at `uri` holds (their keys and stored sizes) in its
    manifest; ExecutionError naming a chunk of its grid that was not written. Called when
    every write has finished, before the array is marked complete."""
    arr = _open(uri, None)
    fs, root = _fs(uri)
    sizes = _listing(fs, root)
    chunks = {}
    for idx in chunk_indices(tuple(arr.shape), _grid(arr)):
        key = arr.metadata.encode_chunk_key(idx)
        if key not in sizes:
            raise ExecutionError(f"{uri}: chunk {idx} was not written; the version is not "
                                 f"published")
        chunks[key] = sizes[key]
    manifest = {"format": 1, "checksum": "crc32c", "chunks": chunks}
    fs.pipe_file(f"{root}/{MANIFEST}", json.dumps(manifest, separators=(",", ":")).encode())
    return manifest


def _listing(fs, root: str) -> dict[str, int]:
    """Key (path under `root`) -> size, for every file of the array."""
    prefix = root.rstrip("/") + "/"
    found = fs.find(root, detail=True)
    return {path[len(prefix):] if path.startswith(prefix) else path: int(info.get("size") or 0)
            for path, info in found.items()}


def read_manifest(uri: str) -> dict | None:
    """The array's manifest, or None when it has none (written before manifests, or by
    another tool)."""
    fs, root = _fs(uri)
    try:
        return json.loads(fs.cat_file(f"{root}/{MANIFEST}"))
    except FileNotFoundError:
        return None


def verify_array(uri: str, deep: bool = True, origin: dict | None = None) -> list[DataError]:
    """Every problem of the stored array at `uri`, without computing anything: a chunk of
    its grid missing from storage, a size other than the manifest's, and (`deep`) a chunk
    that does not decode (checksum). An empty list when it is whole."""
    try:
        arr = _open(uri, origin)
        fs, root = _fs(uri)
        sizes = _listing(fs, root)
        manifest = read_manifest(uri)
    except DataError as err:
        return [err]
    except Exception as err:  # the listing or the manifest cannot be read
        return [_error(uri, origin, None, f"cannot be listed: {type(err).__name__}: {err}")]
    shape, grid = tuple(arr.shape), _grid(arr)
    expected = (manifest or {}).get("chunks", {})
    problems, readable = [], []
    for idx in chunk_indices(shape, grid):
        key = arr.metadata.encode_chunk_key(idx)
        if key not in sizes:
            problems.append(_error(uri, origin, idx, "is missing (deleted, or never written)"
                                   if manifest is not None else LEGACY_MISSING))
        elif key in expected and sizes[key] != expected[key]:
            problems.append(_error(uri, origin, idx, f"is {sizes[key]:,} bytes where "
                                                     f"{expected[key]:,} were written"))
        else:
            readable.append(idx)
    if deep and readable:
        def decode(idx):
            try:
                arr[tuple(slice(lo, hi) for lo, hi in chunk_region(idx, shape, grid))]
                return None
            except Exception as err:
                what = f"is damaged: {_cause(err)}" if is_damage(err) else \
                    f"cannot be read: {_cause(err)}"
                return _error(uri, origin, idx, what)
        with ThreadPoolExecutor(min(VERIFY_THREADS, len(readable))) as pool:
            problems += [p for p in pool.map(decode, readable) if p is not None]
    problems.sort(key=lambda p: (p.chunk is not None, p.chunk or ()))
    return problems


__all__ = ["read_region", "verify_array", "write_manifest", "read_manifest", "array_codecs",
           "describe", "chunk_indices", "chunk_region", "MANIFEST", "WRITE_CONFIG"]
