"""Storage engines: where assets keep the tensors they materialize, behind one protocol.

An engine has a `name` and three methods:

- `write(persisted, uri) -> dict`: store a `dx.persist` output at a new `uri` (never over an
  existing one); returns at least `uri`, `shape`, `dtype`, `chunks` (the stored chunk
  shape), `nbytes`, `stored_bytes` (or None) and `seconds`.
- `reader_uri(uri) -> str`: a path that `dx.run(inputs=...)` and `dx.read_zarr` read.
- `delete(uri)`: drop a stored version (garbage collection); deleting a missing one is fine.

An engine may also write as the graph computes, so a tensor larger than the cluster's
memory can be stored: `create(uri, shape, dtype, chunks) -> uri` makes the empty target,
`write_tasks(uri, tensor_key, shape, dtype, chunks, name) -> dict` gives Dask tasks
(keyed `(name, ...)`) that write the chunks `(tensor_key, *index)` and that a
materialization adds to its graph, and `commit(uri, shape, dtype, chunks, began) -> dict`
marks the target complete once they all finished (returning what `write` returns).
Engines without these get `write` after the tensor is computed and held on the cluster.
An engine may also check what it stored: `verify(uri, deep, origin) -> list[DataError]`
(empty when whole; `deep` reads every chunk, else a listing only), used by `dx.load`, by
materializations before they read a version, and by `deepx-flow assets verify`. `write` and
`commit` may return a `manifest_digest`, which the version's row records and `origin`
carries back (`origin["manifest"]`) to `verify` and to the reads; an engine that checks
versions recorded without one can bind them with `upgrade(uri, origin) -> digest`.

Built in: "zarr" (Zarr v3 arrays on local disk or any fsspec URL, written by the workers)
and "memory" (the chunks stay on the cluster, kept alive in a process-wide table under URIs
like `memory://name/version`; they are not files, so `get(uri)` gives the `Persisted` to
pass as an input instead). `as_input(engine, uri)` gives whichever a run takes.

Third-party engines plug in through the entry-point group `deepx_flow.storage`, e.g. in a
package's `pyproject.toml`:

    [project.entry-points."deepx_flow.storage"]
    lance = "my_package.storage:LanceEngine"

The entry point names an engine object or a class that is instantiated without arguments.
One that fails to load, lacks a method, or reuses a taken name is skipped with a single
RuntimeWarning naming it; the others are unaffected.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
import warnings
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol, runtime_checkable

import numpy as np

from deepx_flow.errors import ExecutionError, InputError
from deepx_flow.storage import verify, zarr_store

ENTRY_POINT_GROUP = "deepx_flow.storage"
METHODS = ("write", "reader_uri", "delete")


@runtime_checkable
class StorageEngine(Protocol):
    """What assets need from a place to keep tensors (see the module docstring)."""

    name: str

    def write(self, persisted, uri: str) -> dict: ...

    def reader_uri(self, uri: str) -> str: ...

    def delete(self, uri: str) -> None: ...


class ZarrEngine:
    """Zarr v3 arrays at local paths or fsspec URLs (see `deepx_flow.storage.zarr_store`)."""

    name = "zarr"

    def write(self, persisted, uri: str, run=None) -> dict:
        return zarr_store.write_persisted(persisted, uri, run)

    def create(self, uri: str, shape, dtype, chunks) -> str:
        uri = zarr_store.normalize_uri(uri)
        zarr_store.create_array(uri, shape, dtype, chunks)
        return uri

    def write_tasks(self, uri: str, tensor_key: str, shape, dtype, chunks, name: str) -> dict:
        return zarr_store.write_tasks(uri, tensor_key, shape, dtype, chunks, name)

    def commit(self, uri: str, shape, dtype, chunks, began: float) -> dict:
        digest = zarr_store.mark_complete(uri)
        return zarr_store.written(uri, shape, dtype, zarr_store.chunk_shape(chunks), began,
                                  digest)

    def reader_uri(self, uri: str) -> str:
        return zarr_store.reader_uri(uri)

    def delete(self, uri: str) -> None:
        zarr_store.delete_array(uri)

    def is_complete(self, uri: str) -> bool:
        return zarr_store.is_complete(uri)

    def verify(self, uri: str, deep: bool = True, origin: dict | None = None) -> list:
        return verify.verify_array(zarr_store.normalize_uri(uri), deep, origin)

    def upgrade(self, uri: str, origin: dict | None = None) -> str:
        return verify.upgrade(zarr_store.normalize_uri(uri), origin)


# The memory engine's table: uri -> Persisted, for the whole process (assets written in one
# notebook cell are read in the next).
_MEMORY: dict = {}
_MEMORY_LOCK = threading.Lock()


class MemoryEngine:
    """Keeps the chunks on the cluster: the fastest store, gone with the cluster or process.

    The table holds its own references to the chunks, so releasing the handle that was
    written does not drop them, and `delete` drops only the table's.
    """

    name = "memory"
    prefix = "memory://"

    def write(self, persisted, uri: str) -> dict:
        from distributed import Future, wait

        from deepx_flow.runtime.futures import why_not_finished

        began = time.perf_counter()
        uri = str(uri)
        if not uri.startswith(self.prefix):
            raise InputError(f"memory storage URIs start with {self.prefix} "
                             f"(like memory://name/version), not {uri!r}")
        if not persisted.futures:
            raise InputError(f"cannot store '{persisted.name}' at {uri}: it was released")
        with _MEMORY_LOCK:
            if uri in _MEMORY:
                raise InputError(f"{uri} already exists; each version is written to a new "
                                 f"location, never over an old one")
        with persisted.client.as_current():  # stored means materialized: fail now
            wait(persisted.futures)
        indices = itertools.product(*(range(len(c)) for c in persisted.chunks))
        for idx, future in zip(indices, persisted.futures):
            if future.status != "finished":
                raise ExecutionError(f"writing {uri}: chunk {idx} failed: "
                                     f"{why_not_finished(future)}")
        own = dataclasses.replace(persisted, futures=[Future(f.key, persisted.client)
                                                      for f in persisted.futures])
        with _MEMORY_LOCK:
            if uri in _MEMORY:
                own.release()
                raise InputError(f"{uri} already exists; each version is written to a new "
                                 f"location, never over an old one")
            _MEMORY[uri] = own
        dtype = np.dtype(persisted.dtype)
        nbytes = math.prod(persisted.shape) * dtype.itemsize
        return {"uri": uri, "shape": tuple(persisted.shape), "dtype": dtype.name,
                "chunks": zarr_store.chunk_shape(persisted.chunks), "nbytes": nbytes,
                "stored_bytes": nbytes, "seconds": time.perf_counter() - began}

    def get(self, uri: str):
        """The `Persisted` stored at `uri`: pass it as an input of `dx.run`."""
        with _MEMORY_LOCK:
            found = _MEMORY.get(str(uri))
            known = ", ".join(sorted(_MEMORY)) or "none"
        if found is None:
            raise InputError(f"nothing is stored at {uri} in memory storage (stored: {known})")
        return found

    def reader_uri(self, uri: str) -> str:
        raise InputError(f"{uri} is held in cluster memory, not in a file; pass "
                         f"get_engine('memory').get(uri) (or as_input(engine, uri)) as the "
                         f"input instead")

    def delete(self, uri: str) -> None:
        with _MEMORY_LOCK:
            found = _MEMORY.pop(str(uri), None)
        if found is not None:
            found.release()

    def uris(self) -> list[str]:
        with _MEMORY_LOCK:
            return sorted(_MEMORY)


def as_input(engine, uri: str):
    """What to give `dx.run(inputs=...)` for a tensor stored at `uri` by `engine` (an engine
    or its name): the held `Persisted` for engines that have `get`, else the reader path."""
    engine = get_engine(engine) if isinstance(engine, str) else engine
    if hasattr(engine, "get"):
        return engine.get(uri)
    return engine.reader_uri(uri)


BUILTIN = {"zarr": ZarrEngine, "memory": MemoryEngine}

_found: dict | None = None   # name -> engine, once discovered
_warned: set = set()          # (entry point, message) already warned about
_lock = threading.Lock()


def engines(refresh: bool = False) -> dict:
    """Every storage engine by name: the built-ins, then the entry points' (looked up once
    per process, again with `refresh=True`)."""
    global _found
    with _lock:
        if _found is None or refresh:
            found = {name: cls() for name, cls in BUILTIN.items()}
            for ep in sorted(entry_points(group=ENTRY_POINT_GROUP),
                             key=lambda e: (e.name, e.value)):
                engine = _load(ep)
                if engine is None:
                    continue
                if engine.name in found:
                    _warn(ep, f"storage engine '{engine.name}' is already registered; skipped")
                    continue
                found[engine.name] = engine
            _found = found
        return dict(_found)


def _load(ep: EntryPoint):
    try:
        obj = ep.load()
        engine = obj() if isinstance(obj, type) else obj
    except Exception as err:  # any failure in third-party code: warn, do not crash
        _warn(ep, f"failed to load: {type(err).__name__}: {err}")
        return None
    missing = [m for m in METHODS if not callable(getattr(engine, m, None))]
    if missing or not isinstance(getattr(engine, "name", None), str):
        lacks = ", ".join(missing + ([] if isinstance(getattr(engine, "name", None), str)
                                     else ["name"]))
        _warn(ep, f"gave {type(engine).__name__}, which lacks {lacks} of a storage engine")
        return None
    return engine


def _warn(ep: EntryPoint, message: str) -> None:
    source = ep.dist.name if ep.dist is not None else ep.value.partition(":")[0]
    text = f"{ENTRY_POINT_GROUP} entry point '{ep.name} = {ep.value}' (from {source}): {message}"
    if text in _warned:
        return
    _warned.add(text)
    warnings.warn(text, RuntimeWarning, stacklevel=4)


def get_engine(name: str):
    """The storage engine called `name`; an InputError lists the known ones otherwise.
    An unknown name looks through the entry points again (a package installed since)."""
    found = engines()
    if name not in found:
        found = engines(refresh=True)
    if name not in found:
        raise InputError(f"unknown storage engine '{name}'; known engines: "
                         f"{', '.join(sorted(found))}")
    return found[name]


def streams(engine) -> bool:
    """Whether `engine` writes as the graph computes (has create, write_tasks, commit)."""
    return all(callable(getattr(engine, m, None)) for m in ("create", "write_tasks", "commit"))


__all__ = ["streams", "StorageEngine", "ZarrEngine", "MemoryEngine", "engines", "get_engine",
           "as_input", "ENTRY_POINT_GROUP"]
