"""Writing tensors held on the cluster (`dx.persist` outputs) to Zarr v3 arrays.

Assets store each materialized version at a fresh location, so a write never overwrites:
an existing path or URL is refused. The driver creates the array's metadata, then one Dask
task per Zarr chunk writes that chunk on a worker, in parallel; the data never passes
through the driver. No two tasks write the same Zarr chunk, so no write needs a lock.

The Zarr chunk shape is the plan's chunk shape (the largest chunk along each axis). On a
regular grid (all chunks equal but a shorter last one per axis) each Zarr chunk is one plan
chunk, and its task depends on that chunk alone and is sent to the worker holding it. On an
irregular grid each task assembles its region from the plan chunks it overlaps.

The array's attributes say who made it (`WRITER_ATTR`: host, PID space, pid and time), so
that what a killed writer left can be told from what a live one is writing (`assets/gc.py`).

Every chunk is written, empty ones too, each with a CRC-32C checksum (`verify.py`). Only
when every chunk is written does the driver write the manifest (`manifest.py`: the array's
metadata, each chunk's stored size and CRC-32C by position; its digest is returned for the
version's row) and then set the attribute `deepx_complete`, so a reader can tell a complete
array from what a crashed write left (`is_complete`), and a damaged chunk from a whole one. A write
that fails deletes what it wrote, best effort, and raises ExecutionError naming the chunk.

Paths are local paths (made absolute, since workers may run in another folder) or any
fsspec URL (`s3://...`, `gs://...`, `memory://...`); `file://` URLs are used as local paths.
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from pathlib import Path

import numpy as np

from deepx_flow.errors import DeepxError, ExecutionError, InputError
from deepx_flow.storage import verify

COMPLETE_ATTR = "deepx_complete"
WRITER_ATTR = "deepx_writer"  # {"host", "space", "pid", "at"}: the process that created it


def normalize_uri(uri) -> str:
    """A local path made absolute (a `file://` URL becomes its path); URLs as they are."""
    uri = str(uri)
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if "://" in uri:
        return uri
    return str(Path(uri).expanduser().resolve())


def reader_uri(uri) -> str:
    """The path to give `dx.run(inputs=...)` or `dx.read_zarr` for the array at `uri`.

    The readers take a local path as Zarr only when it ends in `.zarr` (else as `.npy`), so
    other local paths are given as `file://` URLs, which they always read as Zarr.
    """
    uri = normalize_uri(uri)
    if "://" in uri or uri.rstrip("/").endswith(".zarr"):
        return uri
    return "file://" + uri


def _fs(uri: str):
    """(fsspec file system, path inside it) for a normalized uri."""
    import fsspec
    return fsspec.core.url_to_fs(uri)


def chunk_shape(chunks) -> tuple[int, ...]:
    """The Zarr chunk shape for a plan grid: the largest chunk along each axis (at least 1,
    since Zarr chunks cannot be empty)."""
    return tuple(max(1, max(c, default=0)) for c in chunks)


def is_regular(chunks) -> bool:
    """Whether every chunk along each axis is the same size but a shorter last one: then
    each Zarr chunk is exactly one plan chunk."""
    return all(all(s == c[0] for s in c[:-1]) and (not c or c[-1] <= c[0]) for c in chunks)


def write_persisted(persisted, uri, run=None) -> dict:
    """Write `persisted` (a `dx.persist` output) to a new Zarr v3 array at `uri`.

    Parameters
    ----------
    persisted : deepx_flow.Persisted
        The tensor, still on the cluster; its client runs the write tasks.
    uri : str or path
        A local path or an fsspec URL where nothing exists yet.
    run : RunRecorder, optional
        The recorder of the run the write is part of (a checkpoint's): the write tasks are
        recorded as its tasks, `store[zarr]`.

    Returns
    -------
    dict
        `uri` (normalized: local paths absolute), `shape`, `dtype`, `chunks` (the Zarr
        chunk shape), `nbytes` (uncompressed), `stored_bytes` (on storage; None if it cannot
        be measured), `seconds` (the whole write) and `manifest_digest` (what a stored
        version's row records, `verify.read_region`'s `origin["manifest"]`).

    Raises
    ------
    InputError
        Something exists at `uri`, or the persisted tensor was released.
    ExecutionError
        The array could not be created, or a chunk could not be written (the message names
        the chunk; what was written is deleted first).
    """
    from distributed import wait

    from deepx_flow.runtime.futures import cancel_and_settle, why_not_finished

    began = time.perf_counter()
    uri = normalize_uri(uri)
    if not persisted.futures:
        raise InputError(f"cannot write '{persisted.name}' to {uri}: it was released")
    shape, dtype, chunks = tuple(persisted.shape), np.dtype(persisted.dtype), persisted.chunks
    zchunks = create_array(uri, shape, dtype, chunks)

    client = persisted.client
    tasks = _chunk_writes(persisted)
    futures = []
    try:
        # On a regular grid each task needs one chunk: run it where that chunk is.
        holders = client.who_has(persisted.futures) if is_regular(chunks) else {}
        # Fresh keys: a retried write must not get the result of an earlier attempt.
        name = f"dx-store@{uuid.uuid4().hex[:16]}"  # node "dx-store": one label for all
        if run is not None:
            run.add_tasks(name, "store[zarr]")
        for idx, region, layout, pieces in tasks:
            holder = holders.get(pieces[0].key) if len(pieces) == 1 else None
            where = {"workers": list(holder), "allow_other_workers": True} if holder else {}
            futures.append(client.submit(
                write_block, uri, region, persisted.dtype, layout, *pieces,
                key=(name, *idx), **where))
        with client.as_current():  # wait() uses the current client, not the futures'
            wait(futures)
        failed = [(idx, f) for (idx, *_), f in zip(tasks, futures) if f.status != "finished"]
        if failed:
            idx, future = failed[0]
            cause = why_not_finished(future)
            more = f" (and {len(failed) - 1} more chunks)" if len(failed) > 1 else ""
            raise ExecutionError(f"writing {uri}: chunk {idx}{more} failed: {cause}; "
                                 f"{_delete_quietly(uri)}")
        try:
            digest = mark_complete(uri)
        except DeepxError as err:  # a chunk not there: publish nothing
            raise ExecutionError(f"{err}; {_delete_quietly(uri)}") from None
    except DeepxError:
        raise
    except BaseException as err:  # an interrupt, a lost scheduler, a failed marker write
        cancel_and_settle(client, futures)  # no write may land after the cleanup
        cleanup = _delete_quietly(uri)
        if not isinstance(err, Exception):
            raise
        raise ExecutionError(f"writing {uri} failed: {type(err).__name__}: {err}; "
                             f"{cleanup}") from err
    return written(uri, shape, dtype, zchunks, began, digest)


def create_array(uri: str, shape, dtype, chunks) -> tuple[int, ...]:
    """Create the empty Zarr v3 array for a tensor with plan chunks `chunks` at a new `uri`
    (normalized); return its Zarr chunk shape. Refuses a `uri` where something exists."""
    from deepx_flow.storage.zarr_bfloat16 import zarr
    from zarr.errors import ContainsArrayError, ContainsGroupError

    if _exists(uri):
        raise InputError(f"{uri} already exists; each version is written to a new location, "
                         f"never over an old one")
    zchunks = chunk_shape(chunks)
    try:
        zarr.create_array(store=uri, shape=tuple(shape), dtype=np.dtype(dtype), chunks=zchunks,
                          zarr_format=3, overwrite=False, attributes={WRITER_ATTR: writer()},
                          **verify.array_codecs())
    except (ContainsArrayError, ContainsGroupError):  # another writer got there first
        raise InputError(f"{uri} already exists; each version is written to a new "
                         f"location, never over an old one") from None
    except Exception as err:
        raise ExecutionError(f"cannot create the Zarr array {uri}: {type(err).__name__}: "
                             f"{err}; {_delete_quietly(uri)}") from err
    return zchunks


def writer() -> dict:
    """This process, as `WRITER_ATTR` records it: the host, the PID space (`processes`:
    where its pid names it), the pid and the time."""
    from deepx_flow.processes import this_process

    me = this_process()
    return {"host": me.host, "space": me.space, "pid": me.pid, "at": time.time()}


def write_tasks(uri: str, tensor_key: str, shape, dtype, chunks, name: str) -> dict:
    """Tasks writing the tensor whose plan chunks are `(tensor_key, *index)` into the array
    `create_array` made at `uri`: one per Zarr chunk, keyed `(name, *zarr chunk index)`,
    each returning the bytes it wrote. Added to the graph that computes the tensor, they
    write each chunk as soon as it exists, and the chunk can then be dropped."""
    from deepx_flow.compiler.taskspec import ref, task

    tasks = {}
    for idx, region, layout, keys in zarr_chunk_regions(tensor_key, shape, chunks):
        key = (name, *idx)
        tasks[key] = task(key, write_block, uri, region, str(np.dtype(dtype)), layout,
                          *[ref(k) for k in keys])
    return tasks


def zarr_chunk_regions(tensor_key: str, shape, chunks):
    """Per Zarr chunk (C order): its index, its region, and the layout and keys
    `(tensor_key, *plan index)` of the plan chunks that make it (layout `()` when it is
    exactly one plan chunk)."""
    from deepx_flow.compiler.lower import Grid
    grid, zchunks = Grid(chunks), chunk_shape(chunks)
    counts = [math.ceil(n / c) for n, c in zip(shape, zchunks)]
    for idx in itertools.product(*(range(n) for n in counts)):
        region = tuple((i * c, min((i + 1) * c, n)) for i, c, n in zip(idx, zchunks, shape))
        yield (idx, region, *grid.layout(tensor_key, region))


def mark_complete(uri: str) -> str:
    """Write the manifest of the array at `uri` (ExecutionError if a chunk is missing), then
    set the marker that says every chunk was written; return the manifest's digest."""
    from deepx_flow.storage.zarr_bfloat16 import zarr
    digest = verify.write_manifest(uri)
    zarr.open_array(uri, mode="r+").update_attributes({COMPLETE_ATTR: True})
    return digest


def written(uri: str, shape, dtype, zchunks, began: float, digest: str | None) -> dict:
    """What a finished write reports (see `write_persisted`)."""
    dtype = np.dtype(dtype)
    return {"uri": uri, "shape": tuple(shape), "dtype": dtype.name, "chunks": zchunks,
            "nbytes": math.prod(shape) * dtype.itemsize, "stored_bytes": _stored_bytes(uri),
            "seconds": time.perf_counter() - began, "manifest_digest": digest}


def _chunk_writes(persisted):
    """(Zarr chunk index, region, layout, futures of the plan chunks it needs) per Zarr
    chunk, in C order."""
    by_index = dict(zip(itertools.product(*(range(len(c)) for c in persisted.chunks)),
                        persisted.futures))
    return [(idx, region, layout, [by_index[tuple(k[1:])] for k in keys])
            for idx, region, layout, keys in zarr_chunk_regions("", persisted.shape,
                                                                persisted.chunks)]


def write_block(uri, region, dtype, layout, *pieces):
    """Task: assemble one Zarr chunk's region from its plan chunks and write it."""
    from deepx_flow.storage.zarr_bfloat16 import zarr

    from deepx_flow.kernels.dispatch import to_host
    from deepx_flow.kernels.tasks import cast_chunk
    block = to_host(cast_chunk(dtype, (layout,), *pieces))
    # Empty chunks too: a chunk that is not there must mean it was lost (`verify.py`).
    array = zarr.open_array(uri, mode="r+").with_config(verify.WRITE_CONFIG)
    array[tuple(slice(lo, hi) for lo, hi in region)] = block
    return block.nbytes


def _exists(uri: str) -> bool:
    fs, path = _fs(uri)
    return fs.exists(path)


def _stored_bytes(uri: str) -> int | None:
    """Bytes the array takes on storage (a listing; None where that fails)."""
    try:
        fs, path = _fs(uri)
        return int(fs.du(path, total=True))
    except Exception:
        return None


def _delete_quietly(uri: str) -> str:
    """Delete what a failed write left; say what happened, for the error message."""
    try:
        deleted = delete_array(uri)
    except Exception as err:
        return f"the partial array could not be deleted ({type(err).__name__}: {err})"
    return "the partial array was deleted" if deleted else "nothing was left behind"


def delete_array(uri) -> bool:
    """Delete the array at `uri` (an old version, or a failed write); True if something was
    there. Deleting what does not exist is not an error, so cleanup can be repeated."""
    uri = normalize_uri(uri)
    fs, path = _fs(uri)
    if not fs.exists(path):
        return False
    fs.rm(path, recursive=True)
    return True


def is_complete(uri) -> bool:
    """Whether `uri` holds a Zarr array whose write finished (it has the marker attribute
    that is set only after every chunk was written)."""
    from deepx_flow.storage.zarr_bfloat16 import zarr
    try:
        arr = zarr.open_array(normalize_uri(uri), mode="r")
    except Exception:  # missing, or not a Zarr array
        return False
    return arr.attrs.get(COMPLETE_ATTR) is True


__all__ = ["write_persisted", "create_array", "write_tasks", "mark_complete", "written",
           "delete_array", "is_complete", "reader_uri", "normalize_uri",
           "chunk_shape", "is_regular", "COMPLETE_ATTR", "WRITER_ATTR", "writer"]
