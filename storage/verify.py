"""Checked chunks: every chunk a stored version wrote is there, whole and unchanged when read.

Zarr reads a chunk that is not there as the array's fill value, and its default codecs keep no
checksum, so a deleted chunk reads as zeros and a flipped byte as a wrong value. deepx_flow
writes its arrays so that both are caught, with what Zarr v3 gives:

- a `crc32c` codec after compression (`ARRAY_CODECS`): each chunk carries the checksum of its
  bytes, which Zarr checks as it decodes the chunk, so a flipped byte, a truncated chunk or an
  emptied one fails to decode;
- every chunk written, empty ones too (`WRITE_CONFIG`): a chunk that is not there was lost,
  never skipped;
- a manifest written when the version is complete (`manifest.py`): the array's metadata, and
  the stored size and CRC-32C of each chunk by position, its digest recorded in the
  version's database row; so an edited `zarr.json`, a chunk moved or copied from another
  version, and a manifest edited or deleted are found too.

`read_region` reads a region with its chunks checked: a chunk the region needs that is not
there raises DataError (unless `missing="fill"`, for arrays written by tools that skip empty
chunks), and so does a chunk that fails to decode; the error names the chunk. A read of a
stored version (`origin` with the `manifest` digest its row records) also checks the
manifest, the metadata against it, and each chunk against its entry. `verify_array` checks a
whole stored array without computing anything: the manifest and metadata, the listing
against the manifest, then (`deep`) every chunk decoded and compared with its entry.
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from deepx_flow.errors import DataError, ExecutionError
from deepx_flow.storage import direct, manifest as manifests
from deepx_flow.storage.direct import chunk_region
from deepx_flow.storage.tokens import local_files

MANIFEST = manifests.NAME
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
# What to do about a damaged array that is not a stored asset version (one a user gave):
# nothing records how to compute it again.
REWRITE = "write the array again from its source, or restore it from a copy"


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
            else f"; {REWRITE}")
    problem = f"chunk {tuple(idx)} {what}" if idx is not None else f"the array {what}"
    return DataError(f"{describe(uri, origin)}: {problem} ({uri}){todo}", uri=uri,
                     chunk=None if idx is None else tuple(idx), problem=problem,
                     asset=origin.get("asset"),
                     version=origin.get("version"), partition=origin.get("partition"))


def _unreadable(uri: str, origin, err: OSError) -> ExecutionError:
    """The error for a store that could not be read (a permission, the network, a timeout):
    not damage, since nothing was found wrong with the data, so nothing is to be written
    again; reading it once the failure is mended finds out."""
    return ExecutionError(f"{describe(uri, origin)}: its store could not be read ({uri}): "
                          f"{type(err).__name__}: {err}; this says nothing of the data: "
                          f"make the store readable (its permissions, the network) and try "
                          f"again")


def _open(uri: str, origin):
    from deepx_flow.storage.zarr_bfloat16 import zarr
    try:
        return zarr.open_array(uri, mode="r")
    except FileNotFoundError as err:  # (Zarr's ArrayNotFoundError too) lost: damage
        raise _error(uri, origin, None, f"cannot be opened: {type(err).__name__}: {err}") \
            from None
    except OSError:  # not the data: a permission, the network
        raise
    except Exception as err:  # zarr raises several types for a store that is not an array
        raise _error(uri, origin, None, f"cannot be opened: {type(err).__name__}: {err}") \
            from None


def read_region(uri: str, region, missing: str = "error", origin: dict | None = None
                ) -> np.ndarray:
    """The block `region` ((start, stop) per axis) of the Zarr array at `uri`, its chunks
    checked: DataError for a chunk that is not there (with `missing="error"`) or that does
    not decode (a checksum that does not match, a truncated chunk). For a stored version
    (`origin["manifest"]`, the digest its row records), DataError too for a manifest that
    is not that one, metadata other than it records, and a chunk other than its entry."""
    arr = _open(uri, origin)
    shape, grid = tuple(arr.shape), _grid(arr)
    bound = _bound(uri, arr, origin)
    indices = chunk_indices(shape, grid, region)
    layout = direct.layout_of(arr, uri, bound.chunks if bound is not None else None)
    if layout is not None:  # chunks read without Zarr's pipeline
        try:
            return direct.read_block(layout, region, indices, missing)
        except direct.Missing as err:
            raise _error(uri, origin, err.index, "is missing (deleted, or never written)"
                         + ("" if (origin or {}).get("asset") else FILL_HINT)) from None
        except direct.Damaged as err:
            raise _error(uri, origin, err.index, f"is damaged: {err}") from err
    fs, root = _fs(uri)
    if missing == "error" and indices:
        for idx in indices:
            # A file: Zarr reads a folder in a chunk's place as the fill value too.
            if not fs.isfile(f"{root}/{arr.metadata.encode_chunk_key(idx)}"):
                raise _error(uri, origin, idx, "is missing (deleted, or never written)"
                             + ("" if (origin or {}).get("asset") else FILL_HINT))
    if bound is not None:  # (a byte order read by Zarr alone) each chunk's entry first
        problems = _entries_problems(fs, root, arr, bound, indices)
        if problems:
            raise _error(uri, origin, *problems[0])
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


def read_opened(arr, what: str) -> np.ndarray:
    """The whole of a Zarr array opened by the caller in a store with no path workers can
    read (a `zarr.Array` given as an input, in memory, say), checked as `read_region`
    checks a path: DataError for a chunk that is not stored or does not decode, where
    `np.asarray(arr)` would give the fill value."""
    from zarr.core.sync import sync
    shape, grid = tuple(arr.shape), _grid(arr)
    indices = chunk_indices(shape, grid)
    for idx in indices:
        key = arr.metadata.encode_chunk_key(idx)
        if not sync(arr.store.exists(f"{arr.path}/{key}" if arr.path else key)):
            raise DataError(f"{what}: chunk {idx} is missing (deleted, or never written); if "
                            f"the array was written without its empty chunks, pass "
                            f"np.asarray(array) to read them as its fill value; else "
                            f"{REWRITE}",
                            chunk=idx, problem=f"chunk {idx} is missing")
    try:
        return np.asarray(arr[...])
    except Exception as err:
        if not is_damage(err):
            raise
        bad = _first_undecodable(arr, shape, grid, indices)
        if bad is None:
            raise
        raise DataError(f"{what}: chunk {bad[0]} is damaged: {_cause(bad[1])}; {REWRITE}",
                        chunk=bad[0],
                        problem=f"chunk {bad[0]} is damaged") from err


def _bound(uri: str, arr, origin, fresh: bool = False) -> manifests.Manifest | None:
    """The manifest of a stored version whose row records its digest (`origin["manifest"]`),
    its metadata checked against the array's; None for other arrays. DataError when the
    manifest is missing or another, or the metadata differs. `fresh`: read it again rather
    than take the one this process checked before."""
    expected = (origin or {}).get("manifest")
    if not expected:
        return None
    fs, root = _fs(uri)
    try:
        found = (manifests.bound if fresh else manifests.load)(fs, root, expected)
        problem = manifests.metadata_problem(arr, found)
    except manifests.Problem as err:
        raise _error(uri, origin, None, str(err)) from None
    if problem:
        raise _error(uri, origin, None, problem)
    return found


def _entries_problems(fs, root, arr, found: manifests.Manifest, indices) -> list:
    """(index, problem) for each chunk of `indices` whose stored bytes are not the ones the
    manifest records at its position (read apart from decoding: for arrays Zarr decodes)."""
    keys = {arr.metadata.encode_chunk_key(idx): idx for idx in indices}
    try:
        now = manifests.crcs(fs, root, list(keys), found.sizes(),
                             manifests.has_crc_trailer(found.metadata))
    except manifests.Problem as err:
        return [(keys.get(err.index), str(err))]
    return [(idx, f"is damaged: {direct.NOT_HERE}") for key, idx in keys.items()
            if now[key] != found.chunks[key][1]]


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

def write_manifest(uri: str) -> str:
    """Record the array at `uri` in its manifest (`manifest.py`: its metadata, and each
    chunk's stored size and CRC-32C by position); return the manifest's digest, for the
    version's row. ExecutionError naming a chunk of its grid that was not written. Called
    when every write has finished, before the array is marked complete."""
    arr = _open(uri, None)
    fs, root = _fs(uri)
    sizes = _listing(fs, root)
    keys, missing = _keys(arr, sizes)
    if missing is not None:
        raise ExecutionError(f"{uri}: chunk {missing} was not written; the version is not "
                             f"published")
    try:
        return manifests.write(fs, root, arr, sizes, keys)
    except manifests.Problem as err:
        raise ExecutionError(f"{uri}: chunk {_index(arr, err.index)} {err}; the version "
                             f"is not published") from None


def upgrade(uri: str, origin: dict | None = None) -> str:
    """Bind a version stored before manifests bound its chunks: write its format-2 manifest
    from the chunks as they are now, and return the digest to record in its row. DataError
    (nothing written) when a chunk of its grid is missing, or of another size than its
    older manifest says."""
    arr = _open(uri, origin)
    fs, root = _fs(uri)
    sizes = _listing(fs, root)
    old = manifests.read(fs, root)
    keys, missing = _keys(arr, sizes)
    if missing is not None:
        raise _error(uri, origin, missing, "is missing (deleted, or never written)"
                     if old is not None else LEGACY_MISSING)
    for key in keys:
        if old is not None and key in old.chunks and old.chunks[key][0] != sizes[key]:
            raise _error(uri, origin, _index(arr, key), f"is {sizes[key]:,} bytes where "
                                                        f"{old.chunks[key][0]:,} were written")
    try:
        return manifests.write(fs, root, arr, sizes, keys)
    except manifests.Problem as err:
        raise _error(uri, origin, _index(arr, err.index), str(err)) from None


def _keys(arr, sizes) -> tuple[list[str], tuple | None]:
    """The keys of the array's chunks in C order, and the first one not in `sizes` (None
    when all are stored)."""
    keys = []
    for idx in chunk_indices(tuple(arr.shape), _grid(arr)):
        key = arr.metadata.encode_chunk_key(idx)
        if key not in sizes:
            return keys, idx
        keys.append(key)
    return keys, None


def _index(arr, key):
    return None if key is None else \
        tuple(int(i) for i in arr.metadata.chunk_key_encoding.decode_chunk_key(key))


def _listing(fs, root: str) -> dict[str, int]:
    """Key (path under `root`) -> size, for every file of the array. A folder of a local
    array that cannot be read raises its OSError (`tokens.local_files`): fsspec's walk
    leaves such a folder out, and its chunks would have read as deleted."""
    from fsspec.implementations.local import LocalFileSystem
    if isinstance(fs, LocalFileSystem):
        try:
            return {key: stat.st_size for key, stat in local_files(root)}
        except FileNotFoundError:  # the whole array gone: each chunk is missing
            return {}
    prefix = root.rstrip("/") + "/"
    found = fs.find(root, detail=True)
    return {path[len(prefix):] if path.startswith(prefix) else path: int(info.get("size") or 0)
            for path, info in found.items()}


def read_manifest(uri: str) -> dict | None:
    """The array's manifest as JSON (`manifest.stored`), or None when it has none (written
    before manifests, or by another tool)."""
    data = manifests.stored(*_fs(uri))
    return None if data is None else json.loads(data)


def verify_array(uri: str, deep: bool = True, origin: dict | None = None) -> list[DataError]:
    """Every problem of the stored array at `uri`, without computing anything: its manifest
    not the one its row records (`origin["manifest"]`), its metadata other than the
    manifest's, a chunk of its grid missing from storage, a size other than the manifest's,
    and (`deep`) a chunk that does not decode (checksum) or is not the one written at its
    position. An empty list when it is whole.

    A store that cannot be read (an OSError: a permission, the network, a timeout) is not
    damage: ExecutionError saying so, as reads report it (`is_damage`)."""
    try:
        return _problems(uri, deep, origin)
    except OSError as err:
        raise _unreadable(uri, origin, err) from err


def _problems(uri: str, deep: bool, origin: dict | None) -> list[DataError]:
    """`verify_array`, an OSError raised as it is."""
    try:
        arr = _open(uri, origin)
        fs, root = _fs(uri)
        sizes = _listing(fs, root)
        found = _bound(uri, arr, origin, fresh=True)
        if found is None:  # not bound by a row: whatever manifest it has
            found = manifests.read(fs, root)
            problem = found and manifests.metadata_problem(arr, found)
            if problem:
                return [_error(uri, origin, None, problem)]
    except DataError as err:
        return [err]
    except manifests.Problem as err:
        return [_error(uri, origin, None, str(err))]
    shape, grid = tuple(arr.shape), _grid(arr)
    expected = found.chunks if found is not None else {}
    problems, readable = [], []
    for idx in chunk_indices(shape, grid):
        key = arr.metadata.encode_chunk_key(idx)
        if key not in sizes:
            problems.append(_error(uri, origin, idx, "is missing (deleted, or never written)"
                                   if found is not None else LEGACY_MISSING))
        elif key in expected and sizes[key] != expected[key][0]:
            problems.append(_error(uri, origin, idx, f"is {sizes[key]:,} bytes where "
                                                     f"{expected[key][0]:,} were written"))
        else:
            readable.append(idx)
    if deep and readable:
        entries = found if found is not None and found.format >= 2 else None
        problems += _decode_all(uri, origin, arr, entries, readable)
    problems.sort(key=lambda p: (p.chunk is not None, p.chunk or ()))
    return problems


def _decode_all(uri, origin, arr, found, indices) -> list[DataError]:
    """A DataError for each chunk of `indices` that does not decode, or (with a format-2
    manifest `found`) is not the one written at its position."""
    shape, grid = tuple(arr.shape), _grid(arr)
    layout = direct.layout_of(arr, uri, found.chunks if found is not None else None)

    def decode(idx):
        try:
            if layout is not None:
                direct.check_chunk(layout, idx)
            else:
                arr[tuple(slice(lo, hi) for lo, hi in chunk_region(idx, shape, grid))]
            return None
        except direct.Missing:
            return _error(uri, origin, idx, "is missing (deleted, or never written)")
        except direct.Damaged as err:
            return _error(uri, origin, idx, f"is damaged: {err}")
        except OSError:  # not the data (`verify_array` says so)
            raise
        except Exception as err:
            what = f"is damaged: {_cause(err)}" if is_damage(err) else \
                f"cannot be read: {_cause(err)}"
            return _error(uri, origin, idx, what)

    with ThreadPoolExecutor(min(VERIFY_THREADS, len(indices))) as pool:
        problems = [p for p in pool.map(decode, indices) if p is not None]
    if layout is None and found is not None:  # decoded by Zarr: the entries apart
        bad = {p.chunk for p in problems}
        fs, root = _fs(uri)
        problems += [_error(uri, origin, idx, what) for idx, what in _entries_problems(
            fs, root, arr, found, [i for i in indices if i not in bad])]
    return problems


__all__ = ["read_region", "read_opened", "verify_array", "write_manifest", "read_manifest",
           "upgrade", "array_codecs", "describe", "chunk_indices", "chunk_region", "MANIFEST",
           "WRITE_CONFIG"]
