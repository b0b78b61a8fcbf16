"""Binding a run's inputs: NumPy arrays, `.npy` files and Zarr arrays, checked up front.

Each bound input knows how to make the task that loads one region. NumPy arrays travel inside
the task graph (one data task per chunk), so the scheduler can send a chunk again if the
worker holding it dies; files are read by the worker that needs the region. Every problem
(a missing input, a wrong shape or dtype, a missing file) is an InputError naming the input;
so is a stored array a `read_zarr` node reads that is missing or not what the node states.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from dask.base import tokenize

from deepx_flow.compiler.lower import Grid
from deepx_flow.compiler.taskspec import data_node, ref, task
from deepx_flow.errors import InputError, shown
from deepx_flow.ir import Graph
from deepx_flow.kernels.tasks import cast_chunk, to_device
from deepx_flow.storage.readers import array_info, read_region, zarr_info


@dataclass(frozen=True)
class ArraySource:
    array: np.ndarray
    token: str

    def task(self, key, region):
        block = self.array[tuple(slice(lo, hi) for lo, hi in region)]
        # copy=None copies only non-contiguous blocks; 0-d blocks stay 0-d.
        return task(key, to_device, data_node(key + ("data",),
                                              np.array(block, order="C", copy=None)))


@dataclass(frozen=True)
class FileSource:
    path: str
    token: str

    def task(self, key, region):
        return task(key, load_region, self.path, region)

    def inline(self, region):
        """(func, args) reading `region` inside the task that uses it (`compiler.inline`)."""
        return load_region, (self.path, region)


@dataclass(frozen=True)
class KeySource:
    """The chunks `(key, *index)` of a tensor computed earlier on the cluster (a training's
    step before): tasks read the ones their region needs."""

    key: str
    chunks: tuple
    dtype: str

    @property
    def token(self) -> str:
        return self.key

    def task(self, key, region):
        layout, keys = Grid(self.chunks).layout(self.key, region)
        return task(key, cast_chunk, self.dtype, (layout,), *[ref(k) for k in keys])


@dataclass(frozen=True)
class PersistedSource(KeySource):
    """An output of an earlier `dx.persist`, still on the cluster: tasks read its chunks."""

    scheduler: str  # id of the scheduler that holds the chunks
    address: str


def check_sources_on(sources: dict, client) -> None:
    """Persisted inputs can only be read on the cluster that holds them."""
    persisted = {n: s for n, s in sources.items() if isinstance(s, PersistedSource)}
    if not persisted:
        return
    # Scheduler ids, not addresses: one scheduler has several addresses (localhost, an IP).
    here = client.scheduler_info()["id"]
    for name, source in persisted.items():
        if source.scheduler != here:
            raise InputError(f"input '{name}' is a persisted output held by the cluster at "
                             f"{source.address}, but this run uses {client.scheduler.address};"
                             f" run on that cluster or gather it first with .to_numpy()")


def load_region(path, region):
    return to_device(read_region(path, region))


def check_stored_arrays(graph: Graph) -> Graph:
    """Check that every `read_zarr` node's array exists with the node's shape and dtype.

    Only the arrays' metadata is read, on the driver, so a missing or mismatched store is an
    InputError naming the node before any cluster is started or contacted, instead of a
    failure on the workers that read it. Returns the graph.
    """
    for node in graph.nodes:
        if node.op != "read_zarr":
            continue
        uri = node.attr("uri")
        try:
            shape, dtype = zarr_info(uri)
        except InputError as err:
            raise InputError(f"node {shown(node.id)}: {err}; read_zarr needs an existing "
                             "array (a path or URL the driver and workers can read)") from None
        for what, stored, stated in (("shape", shape, node.shape), ("dtype", dtype, node.dtype)):
            if stored != stated:
                raise InputError(f"node {shown(node.id)}: the Zarr array {uri} has {what} "
                                 f"{stored}, but the node states {stated}; state what is "
                                 "stored, or point at the right array")
    return graph


def bind_inputs(graph: Graph, inputs: dict | None) -> dict:
    """Check `inputs` against the graph's input nodes, and the arrays its `read_zarr` nodes
    read (`check_stored_arrays`); return a source for each input."""
    check_stored_arrays(graph)
    inputs = dict(inputs or {})
    sources = {}
    for node in graph.inputs:
        if node.id not in inputs:
            given = ", ".join(sorted(inputs)) or "none"
            raise InputError(f"input '{node.id}' {node.shape} {node.dtype} was not given "
                             f"(inputs given: {given})")
        value = inputs.pop(node.id)
        if hasattr(value, "futures") and hasattr(value, "chunks"):  # a dx.Persisted
            if not value.futures:
                raise InputError(f"input '{node.id}': persisted output '{value.name}' was "
                                 f"released")
            shape, dtype = value.shape, value.dtype
            source = PersistedSource(value.key, value.chunks, value.dtype,
                                     value.client.scheduler_info()["id"],
                                     value.client.scheduler.address)
            where = f"persisted output '{value.name}'"
        elif isinstance(value, (str, os.PathLike)):
            # Workers may run in another folder: local paths are made absolute here.
            path = str(value) if "://" in str(value) else str(Path(value).resolve())
            shape, dtype = array_info(path)
            stat = Path(path).stat() if Path(path).exists() else None
            source = FileSource(path, tokenize(path, stat and (stat.st_mtime_ns,
                                                                stat.st_size)))
            where = f"file {path}"
        else:
            array = np.asarray(value)
            shape, dtype = array.shape, array.dtype.name
            source = ArraySource(array, tokenize(array))
            where = "the array given"
        if tuple(shape) != node.shape:
            raise InputError(f"input '{node.id}' must have shape {node.shape}, but {where} has "
                             f"shape {tuple(shape)}")
        if dtype != node.dtype:
            raise InputError(f"input '{node.id}' must have dtype {node.dtype}, but {where} has "
                             f"dtype {dtype}; convert it first (array.astype('{node.dtype}'))")
        sources[node.id] = source
    if inputs:
        raise InputError(f"unknown input(s) {', '.join(sorted(inputs))}; the graph's inputs are "
                         f"{', '.join(n.id for n in graph.inputs) or 'none'}")
    return sources
