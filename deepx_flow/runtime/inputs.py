"""Binding a run's inputs: NumPy arrays, `.npy` files, Zarr arrays and dask arrays, checked
up front.

Each bound input knows how to make the task that loads one region. NumPy arrays travel inside
the task graph (one data task per chunk), so the scheduler can send a chunk again if the
worker holding it dies; files are read by the worker that needs the region. Every problem
(a missing input, a wrong shape or dtype, a missing file) is an InputError naming the input;
so is a stored array a `read_zarr` node reads that is missing or not what the node states.

Each source has a `token` naming its data, which the lowering puts in the task keys: an
array's content token, a dask array's name, a persisted output's key, and for files and Zarr
arrays a token of their listing that changes whenever they are written (`storage/tokens.py`),
so a run never takes chunks that a persisted output computed from data since rewritten.

A dask array (`dx.from_dask`, or given in `inputs=`) brings its own graph: the lowering adds
its tasks to the run's (`DaskSource.dask_tasks`), and a region of the input is a task that
reads the dask chunks under it (their keys are its dependencies) and cuts and joins them to
the plan's chunk grid on the worker (`dask_region`), usually inside the task that uses the
region (the inline pass treats it as a file read). Nothing is gathered to the driver.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from dask.base import tokenize

from deepx_flow.compiler.lower import Grid
from deepx_flow.compiler.taskspec import data_node, dependency_order, ref, task
from deepx_flow.errors import DataError, InputError, shown
from deepx_flow.ir import Graph, dtypes
from deepx_flow.kernels.tasks import cast_chunk, to_device
from deepx_flow.storage.readers import array_info, read_region, zarr_info
from deepx_flow.storage.tokens import data_token


@dataclass(frozen=True, slots=True, eq=False)
class Binding:
    """The data a tensor carries to its input node (`sdk/bindings.py`): `value` (a NumPy or
    dask array, or the path of a `.npy` file) and `token`, which identifies it (the array's
    content token, the dask array's name)."""

    value: Any
    token: str

    @property
    def kind(self) -> str:
        return "NumPy array" if isinstance(self.value, np.ndarray) else \
            "file" if isinstance(self.value, str) else "dask array"


def checked_inputs(inputs) -> dict:
    """The `inputs=` argument of a run as a dict, or an InputError saying what it takes: a
    mapping (or None) of input names (strings) to data. The data are checked as they are
    bound, against the graph (`bind_inputs`)."""
    if inputs is None:
        return {}
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a dict of input name -> array, file path or "
                         f"persisted output, e.g. inputs={{'x': array}}; got "
                         f"{type(inputs).__name__} {shown(inputs)}")
    names = [name for name in inputs if not isinstance(name, str)]
    if names:
        raise InputError(f"inputs must be named by strings (the names of the graph's "
                         f"inputs), got the key {shown(names[0])} ({type(names[0]).__name__})")
    return dict(inputs)


@dataclass(frozen=True)
class ArraySource:
    array: np.ndarray
    token: str

    def task(self, key, region):
        return task(key, to_device, data_node(key + ("data",), region_block(self.array,
                                                                            region)))


def region_block(array, region) -> np.ndarray:
    """The block of `array` in `region` ((lo, hi) per axis), C-contiguous: copy=None copies
    only a non-contiguous block; a 0-d block stays 0-d."""
    return np.array(array[tuple(slice(lo, hi) for lo, hi in region)], order="C", copy=None)


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


@dataclass(frozen=True, eq=False)
class DaskSource:
    """A dask array bound to an input: its tasks join the run's graph (`dask_tasks`), and a
    region is read from the dask chunks under it (`dask_region`)."""

    array: object  # a dask.array.Array, chunks of known sizes
    dtype: str

    @property
    def token(self) -> str:
        return self.array.name  # dask's own token of the array's graph

    @cached_property
    def grid(self) -> Grid:
        return Grid(self.array.chunks)

    def _read(self, region):
        layout, keys = self.grid.layout(self.array.name, region)
        shapes = tuple(_chunk_shape(self.array.chunks, k[1:]) for k in keys)
        return (self.array.name, self.dtype, layout, shapes, *[ref(k) for k in keys])

    def task(self, key, region):
        return task(key, dask_region, *self._read(region))

    def inline(self, region):
        """(func, args) reading `region` inside the task that uses it (`compiler.inline`)."""
        return dask_region, self._read(region)

    def dask_tasks(self) -> dict:
        """The array's tasks, optimized as dask would for computing it (culled, blockwise
        fused), in dependency order; see `dask_graph_tasks`."""
        array = self.array
        return dask_graph_tasks(array.__dask_optimize__(array.__dask_graph__(),
                                                        array.__dask_keys__()))


def dask_graph_tasks(graph) -> dict:
    """A dask collection's graph as tasks the run's graph can hold, in dependency order.

    Dask's graphs mix legacy tuples, raw values (`da.from_array`'s chunks), `Alias`es and
    `DataNode`s; the passes and the recorder read every task's arguments, which only a
    `Task` has. So everything becomes a Task: legacy forms through dask's own converter, and
    an alias or a value as a task returning its target or value."""
    from dask._task_spec import Alias, DataNode, Task, convert_legacy_graph
    converted = convert_legacy_graph(dict(graph))
    out: dict = {}
    for key in dependency_order(converted):
        node = converted[key]
        if isinstance(node, Alias):
            node = task(key, _same, ref(node.target))
        elif isinstance(node, DataNode):
            node = task(key, _same, data_node(None, node.value))
        elif not isinstance(node, Task):
            raise InputError(f"the dask graph holds a {type(node).__name__} at {key!r}, "
                             "which deepx_flow cannot run; compute or persist the array first")
        out[key] = node
    return out


def _same(value):
    return value


def _chunk_shape(chunks, idx) -> tuple[int, ...]:
    return tuple(int(c[i]) for c, i in zip(chunks, idx))


def dask_region(name, dtype, layout, shapes, *pieces):
    """A region of a dask array from its chunks `pieces` (C order over `layout`, as
    `Grid.layout` gives them), each checked against the shape and dtype the array states:
    a dask graph whose chunks are not what its metadata says (a `map_blocks` given a wrong
    `dtype=`, say) would otherwise be cut wrongly or change dtype silently."""
    blocks = []
    for piece, shape in zip(pieces, shapes):
        block = piece if hasattr(piece, "__cuda_array_interface__") else np.asarray(piece)
        if tuple(block.shape) != shape or block.dtype.name != dtype:
            raise DataError(f"a chunk of the dask array {name} is {block.dtype.name} of shape "
                            f"{tuple(block.shape)}, but the array states {dtype} chunks of "
                            f"shape {shape}; fix the dask array's dtype= or chunks (its "
                            f"meta), or cast it with .astype() before dx.from_dask",
                            problem="chunk does not match the array's metadata")
        blocks.append(block)
    return to_device(cast_chunk(dtype, (layout,), *blocks))


def check_dask_array(array, what: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of a dask array a graph can read: an InputError naming `what` for
    chunk sizes that are not known (NaN, after boolean indexing or unknown file lengths)
    or a dtype deepx_flow has no kernels for."""
    for axis, sizes in enumerate(array.chunks):
        if any(isinstance(c, float) and math.isnan(c) for c in sizes):
            raise InputError(f"{what} has chunks of unknown size (NaN) along axis {axis} "
                             f"(shape {array.shape}); a plan needs every chunk's size: call "
                             "array.compute_chunk_sizes() first, or build it with known "
                             "chunks")
    try:
        dtype = dtypes.normalize(array.dtype)
    except Exception as err:
        raise InputError(f"{what}: {err}") from None
    return tuple(int(s) for s in array.shape), dtype


def is_dask_array(value) -> bool:
    """Whether `value` is a dask.array.Array (without importing dask.array for others)."""
    return type(value).__module__.startswith("dask.array") and hasattr(value, "chunks") \
        and hasattr(value, "__dask_graph__")


def is_zarr_array(value) -> bool:
    """Whether `value` is a zarr.Array (without importing zarr for others)."""
    return type(value).__module__.startswith("zarr.") and hasattr(value, "metadata") \
        and hasattr(value, "store")


def zarr_input(array, what: str):
    """What a run binds for a zarr.Array input: the path of one in local files (its chunks
    are then read by the workers, checked, exactly as when the path is given), else the
    whole array read here with the same checks (`verify.read_opened`): a chunk that is not
    stored is a DataError either way, never the fill value."""
    from zarr.storage import LocalStore

    from deepx_flow.storage.verify import read_opened
    from deepx_flow.storage.zarr_store import reader_uri
    if isinstance(array.store, LocalStore):
        root = array.store.root
        return reader_uri(root / array.path if array.path else root)
    return read_opened(array, what)


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


def _file_source(name: str, value) -> tuple[FileSource, tuple[int, ...], str]:
    """The source, shape and dtype of the file (or URL) `value` given for input `name`: an
    InputError naming the input when it is not an array that can be read."""
    try:
        # Workers may run in another folder: local paths are made absolute here.
        path = str(value) if "://" in str(value) else str(Path(value).resolve())
        shape, dtype = array_info(path)
    except InputError as err:  # a DataError (a file cut short) stays one
        given = "" if path == str(value) else f" (given as {shown(str(value), 300)})"
        message = f"input '{name}'{given}: {err}"
        raise (DataError(message, uri=err.uri, problem=err.problem)
               if isinstance(err, DataError) else InputError(message)) from None
    except (OSError, ValueError) as err:  # a path the system refuses (a NUL byte, too long)
        raise InputError(f"input '{name}': cannot use the path {shown(str(value), 300)}: "
                         f"{err}") from None
    # The token changes with the data (`storage/tokens.py`): chunks a persisted output of an
    # earlier run holds are taken for this run's only when the files are as they were.
    return FileSource(path, data_token(path)), shape, dtype


def _array(name: str, value) -> np.ndarray:
    """`value` given for input `name` as a NumPy array; an InputError when it is none (a
    ragged list, an object that cannot be converted)."""
    try:
        array = np.asarray(value)
    except Exception as err:  # NumPy raises ValueError, TypeError and others for such data
        raise InputError(f"input '{name}': {type(value).__name__} {shown(value)} is not an "
                         f"array, a file path or a persisted output: {err}") from None
    if array.dtype.hasobject:
        raise InputError(f"input '{name}': {type(value).__name__} {shown(value)} is not an "
                         f"array of numbers, a file path or a persisted output")
    return array


def check_stored_arrays(graph: Graph) -> Graph:
    """Check that every `read_zarr` node's array exists with the node's shape and dtype.

    Only the arrays' metadata is read, on the driver, so a missing or mismatched store is an
    InputError naming the node before any cluster is started or contacted, instead of a
    failure on the workers that read it; for a stored asset version (a node with `asset`,
    from `dx.load`) it is a DataError naming the version, since the version was written
    with the node's shape and dtype and what is stored now is damage. Returns the graph.
    """
    for node in graph.nodes:
        if node.op != "read_zarr":
            continue
        uri = node.attr("uri")
        try:
            shape, dtype = zarr_info(uri)
        except InputError as err:
            raise _stored_error(node, f"node {shown(node.id)}: {err}; read_zarr needs an "
                                      "existing array (a path or URL the driver and workers "
                                      "can read)") from None
        for what, stored, stated in (("shape", shape, node.shape), ("dtype", dtype, node.dtype)):
            if stored != stated:
                raise _stored_error(node, f"node {shown(node.id)}: the Zarr array {uri} has "
                                          f"{what} {stored}, but the node states {stated}; "
                                          "state what is stored, or point at the right array")
    return graph


def _stored_error(node, message: str) -> InputError:
    """InputError, or for the read of a stored asset version a DataError naming it."""
    from deepx_flow.ops.sources import NAMED_BY
    from deepx_flow.storage.verify import describe
    origin = {k: node.attr(k) for k in NAMED_BY}
    if not origin["asset"]:
        return InputError(message)
    uri = node.attr("uri")
    return DataError(f"{describe(uri, origin)}: {message}; materialize {origin['asset']} "
                     f"again to replace it", uri=uri, problem="not what was written",
                     **origin)


def bind_inputs(graph: Graph, inputs: dict | None) -> dict:
    """Check `inputs` against the graph's input nodes, and the arrays its `read_zarr` nodes
    read (`check_stored_arrays`); return a source for each input."""
    check_stored_arrays(graph)
    inputs = dict(inputs or {})
    given = ", ".join(sorted(inputs)) or "none"  # (before the loop takes them)
    sources = {}
    for node in graph.inputs:
        if node.id not in inputs:
            raise InputError(f"input '{node.id}' {node.shape} {node.dtype} was not given "
                             f"(inputs given: {given})")
        value = inputs.pop(node.id)
        token = None
        if isinstance(value, Binding):  # data a tensor carries, with its token
            value, token = value.value, value.token
        if is_zarr_array(value):  # read as its path is, or checked as that would be
            value = zarr_input(value, f"input '{node.id}': the Zarr array given")
        if is_dask_array(value):
            shape, dtype = check_dask_array(value, f"input '{node.id}': the dask array "
                                                   f"{value.name}")
            source = DaskSource(value, dtype)
            where = f"the dask array {value.name}"
        elif hasattr(value, "futures") and hasattr(value, "chunks"):  # a dx.Persisted
            if not value.futures:
                raise InputError(f"input '{node.id}': persisted output '{value.name}' was "
                                 f"released")
            shape, dtype = value.shape, value.dtype
            source = PersistedSource(value.key, value.chunks, value.dtype,
                                     value.client.scheduler_info()["id"],
                                     value.client.scheduler.address)
            where = f"persisted output '{value.name}'"
        elif isinstance(value, (str, os.PathLike)):
            source, shape, dtype = _file_source(node.id, value)
            where = f"file {source.path}"
        else:
            array = _array(node.id, value)
            shape, dtype = array.shape, array.dtype.name
            source = ArraySource(array, token or tokenize(array))
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
