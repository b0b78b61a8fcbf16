"""Training data: the rows of one or more arrays, in an order that depends only on (seed, epoch).

A dataset is a tuple of columns (features, labels, ...) with the same number of rows: NumPy
arrays, or stored Zarr arrays (`dx.read_zarr` tensors or paths), which are never loaded whole.

Order. The rows are cut into blocks: a stored array's chunks along its rows (so a block is read
by decoding one stored chunk), or blocks of `ARRAY_BLOCK_ROWS` rows for arrays in memory. Each
epoch draws, from a generator seeded by (seed, epoch) alone, a permutation of the blocks, groups
consecutive blocks into windows of `window_blocks`, and permutes the rows within each window.
The epoch's order is the windows' rows one after the other: a permutation of all the rows that
depends on the seed, the epoch and the data's blocks, never on the workers. Batches are
consecutive runs of `batch_size` rows of that order; a last run shorter than a batch is left out
(every step then has the same shape, so one compiled step serves them all). A batch is a set of
rows: its loss and gradient do not depend on their order, so each batch takes its rows in
increasing order, and every chunk of it reads each stored block it needs as one sequential run
(a random gather was most of a step's reading).

Streaming. Each chunk of a batch is read by the task that uses it, on its worker: rows of an
array in memory from the copy every worker was sent once; rows of a stored array from the
worker's cache of decoded blocks (`read_rows`), which holds about a window's blocks, so a
worker decodes each block once per epoch however many of its batches read it, and no batch
passes through one worker on its way to another.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize

from deepx_flow.errors import GraphError, InputError, shown
from deepx_flow.sdk.random import derive_seed

# Rows per block of an array held in memory (its "stored chunk" for shuffling).
ARRAY_BLOCK_ROWS = 4096


@dataclass(frozen=True)
class Column:
    """One array of the dataset: in memory (`array`) or stored (`uri`)."""

    shape: tuple[int, ...]
    dtype: str
    array: np.ndarray | None = None
    uri: str | None = None
    chunk_rows: int | None = None  # rows per stored chunk

@dataclass(frozen=True)
class Dataset:
    columns: tuple[Column, ...]
    rows: int
    block_rows: int
    token: str

    @property
    def blocks(self) -> int:
        return math.ceil(self.rows / self.block_rows)


def dataset_of(data) -> Dataset:
    """A Dataset from a tuple of columns: NumPy arrays, `dx.read_zarr` tensors or Zarr paths.
    Raises InputError naming the column that is missing, unreadable or of another length."""
    from deepx_flow.sdk.tensor import Tensor
    from deepx_flow.storage.readers import storage_chunks, zarr_info
    if not isinstance(data, (tuple, list)) or not data:
        raise InputError(f"data must be a tuple of arrays (features, labels, ...), got "
                         f"{shown(data)}")
    columns, block_rows, tokens = [], None, []
    for i, item in enumerate(data):
        if isinstance(item, Tensor):
            if item.node.op != "read_zarr":
                raise InputError(f"data column {i} is a computed tensor ({item.node.op}); "
                                 "train on stored data (dx.read_zarr) or NumPy arrays, or "
                                 "store it first as an asset")
            item = item.node.attr("uri")
        if isinstance(item, str):
            shape, dtype = zarr_info(item)
            chunks = storage_chunks(item)
            column = Column(tuple(shape), dtype, uri=item,
                            chunk_rows=chunks[0] if chunks else shape[0])
            if chunks and block_rows is None:
                block_rows = chunks[0]
            tokens.append(("zarr", item, shape, dtype))
        elif isinstance(item, np.ndarray):
            column = Column(item.shape, item.dtype.name, array=item)
            tokens.append(("array", tokenize(item)))
        else:
            raise InputError(f"data column {i} is a {type(item).__name__}; give NumPy arrays, "
                             "dx.read_zarr tensors or Zarr paths")
        if not column.shape:
            raise InputError(f"data column {i} is 0-d; columns have one row per sample")
        columns.append(column)
    rows = columns[0].shape[0]
    for i, column in enumerate(columns):
        if column.shape[0] != rows:
            raise InputError(f"data column {i} has {column.shape[0]} rows, column 0 has {rows}")
    if rows == 0:
        raise InputError("the training data has no rows")
    block_rows = min(block_rows or ARRAY_BLOCK_ROWS, rows)
    return Dataset(tuple(columns), rows, block_rows, tokenize(tokens, block_rows))


def epoch_order(data: Dataset, seed: int, epoch: int, window_blocks: int) -> list[np.ndarray]:
    """The row indices of each window of `epoch`, in their shuffled order (see the module
    docstring); concatenated, a permutation of all rows."""
    rng = np.random.default_rng(derive_seed(seed, epoch))
    blocks = rng.permutation(data.blocks)
    windows = []
    for w in range(0, len(blocks), window_blocks):
        rows = np.concatenate([np.arange(b * data.block_rows,
                                         min((b + 1) * data.block_rows, data.rows))
                               for b in blocks[w:w + window_blocks]])
        windows.append(rows[rng.permutation(len(rows))])
    return windows


@dataclass(frozen=True)
class Piece:
    """Rows `lo:hi` of window `window` of an epoch."""

    window: int
    lo: int
    hi: int


class EpochRows:
    """The rows of each batch: consecutive runs of `batch_size` rows of the epoch's order,
    sorted (see the module docstring); the orders of the two latest epochs kept (past epochs
    are let go, so the driver never holds every epoch's order)."""

    def __init__(self, data: Dataset, seed: int, window_blocks: int, batch_size: int):
        self.data, self.seed, self.window_blocks = data, seed, window_blocks
        self.batch_size = batch_size
        self.orders: dict[int, np.ndarray] = {}

    def rows(self, epoch: int, batch: int) -> np.ndarray:
        if epoch not in self.orders:
            self.orders[epoch] = np.concatenate(
                epoch_order(self.data, self.seed, epoch, self.window_blocks))
            for old in [e for e in self.orders if e < epoch - 1]:
                del self.orders[old]
        return np.sort(self.orders[epoch][batch * self.batch_size:(batch + 1) * self.batch_size])


def batch_pieces(windows: list[np.ndarray], batch_size: int) -> list[list[Piece]]:
    """Each full batch of an epoch as pieces of consecutive windows."""
    sizes = [len(w) for w in windows]
    total = sum(sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out = []
    for b in range(total // batch_size):
        lo, hi = b * batch_size, (b + 1) * batch_size
        pieces = []
        for w in range(len(windows)):
            a, z = max(lo, starts[w]), min(hi, starts[w + 1])
            if a < z:
                pieces.append(Piece(w, int(a - starts[w]), int(z - starts[w])))
        out.append(pieces)
    return out


def window_blocks_for(data: Dataset, memory_limit: int) -> int:
    """How many blocks a window holds: as many as keep two windows (the one in use and the
    next, loading) within a quarter of one worker's memory, at least one."""
    row_bytes = sum(math.prod(c.shape[1:]) * np.dtype(c.dtype).itemsize for c in data.columns)
    block_bytes = max(1, row_bytes * data.block_rows)
    return max(1, min(data.blocks, int(memory_limit // 8 // block_bytes)))


def check_batch_size(data: Dataset, batch_size) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise GraphError(f"batch_size must be a positive integer, got {shown(batch_size)}")
    if batch_size > data.rows:
        raise InputError(f"batch_size {batch_size} is larger than the {data.rows} rows of "
                         "the training data")


def read_rows(column: Column, index: np.ndarray, scope: str = "") -> np.ndarray:
    """Rows `index` of a stored column: each stored chunk they fall in is read, checked
    (`storage.readers.read_region`) and kept in this process's block cache under `scope` (one
    training: the data may not change during it), and the rows taken from it. The column's
    shape and chunking were read once, by `dataset_of`."""
    from deepx_flow.kernels import recycled
    from deepx_flow.storage.readers import read_region
    uri, shape = column.uri, column.shape
    step = column.chunk_rows or 1
    order = None if np.all(index[1:] >= index[:-1]) else np.argsort(index, kind="stable")
    ordered = index if order is None else index[order]
    blocks = ordered // step
    # Runs of rows in one block: the sorted rows of a block are one slice of `ordered`.
    starts = np.flatnonzero(np.diff(blocks, prepend=-1))
    ends = np.append(starts[1:], len(ordered))
    # Recycled memory: fresh pages cost as much as the copy here (`kernels.recycled`).
    out = recycled.empty((len(index),) + tuple(shape[1:]), column.dtype)
    target = out if order is None else recycled.empty(out.shape, out.dtype)
    for a, z in zip(starts, ends):
        block = int(blocks[a])
        lo, hi = block * step, min((block + 1) * step, shape[0])
        region = ((lo, hi),) + tuple((0, s) for s in shape[1:])
        part = BLOCKS.get((scope, uri, block), lambda: np.asarray(read_region(uri, region)))
        np.take(part, ordered[a:z] - lo, axis=0, out=target[a:z])
    if order is not None:
        out[order] = target
    return out


class BlockCache:
    """Decoded blocks of stored training data in this process, least recently used dropped
    first, at most `limit()` bytes: an eighth of the Dask worker's memory limit (a window's
    blocks fit a quarter, for two windows), or 1 GiB outside a worker. A block several
    threads ask for at once is decoded once: the others wait for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries: OrderedDict = OrderedDict()
        self.loading: dict = {}  # key -> lock held while one thread decodes the block
        self.nbytes = 0

    def get(self, key, load) -> np.ndarray:
        while True:
            with self.lock:
                if key in self.entries:
                    self.entries.move_to_end(key)
                    return self.entries[key]
                busy = self.loading.get(key)
                if busy is None:
                    busy = self.loading[key] = threading.Lock()
                    busy.acquire()
                    break
            with busy:  # another thread decodes it: wait, then look again
                pass
        try:
            value = load()  # decoded outside the cache's lock: other blocks go on meanwhile
            with self.lock:
                self.entries[key] = value
                self.nbytes += value.nbytes
                limit = self.limit()
                while self.nbytes > limit and len(self.entries) > 1:
                    _, dropped = self.entries.popitem(last=False)
                    self.nbytes -= dropped.nbytes
                return self.entries.get(key, value)
        finally:
            with self.lock:
                del self.loading[key]
            busy.release()

    @staticmethod
    def limit() -> int:
        try:
            from distributed import get_worker
            memory = get_worker().memory_manager.memory_limit
        except (ImportError, ValueError, AttributeError):
            memory = None
        return memory // 8 if memory else 2**30


BLOCKS = BlockCache()
