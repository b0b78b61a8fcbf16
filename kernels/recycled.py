"""Chunk-sized arrays from recycled memory.

Why: a NumPy array larger than 32 MiB is a mapping of its own (glibc maps anything that
large), so every new chunk-sized array faults in fresh pages and freeing it hands them back
to the kernel. Faulting in fresh memory costs about 0.1 s per GB on bare metal; on virtual
machines whose guest reports free pages to the host (virtio-balloon free page reporting, as
on the machines this project is measured on) it cost 1.1 s per GB once freed pages had been
handed back, which is as long as decoding that GB. Streaming work allocates its input's size
every run, so it paid that in every run after the first. Memory pools are the usual answer
(RMM on the GPU, jemalloc's retained pages): here a process keeps its chunk-sized buffers and
hands one out again once nothing refers to it any more, which its reference count says.

An array from `empty` is a view of a pooled buffer; every view made from it keeps the buffer
(NumPy's `base`), so a buffer is free exactly when the pool holds the only reference. Free
buffers are memory no task uses, so the pool keeps at most `limit` bytes of them (a tenth of
the worker's memory limit; `DEEPX_BUFFER_POOL_BYTES` sets it, 0 turns the pool off), the
longest free going first, and releases any free for `IDLE_SECONDS`, so an idle worker gives
its memory back. Python without the GIL gets no pool (see `BufferPool.__init__`).
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
import weakref

import numpy as np


MIN_BYTES = 4 << 20  # smaller arrays come from malloc's own free lists
PAGE = 4096
IDLE_SECONDS = 30.0
# Freed buffers are brought under the limit this often (and on every allocation): a paused
# or idle worker allocates nothing, and Dask's memory monitor counts what the pool holds.
TRIM_SECONDS = 1.0
# A free buffer up to this much larger than asked for is used (a ragged last chunk takes a
# full chunk's buffer when it is nearly full); what it wastes is memory Dask does not see.
SLACK = 1.125


def _references(buffers: list, i: int) -> int:
    """The reference count of `buffers[i]`, always taken the same way (see _UNUSED)."""
    return sys.getrefcount(buffers[i])


# What `_references` says of a buffer that only its list holds: measured, not assumed, since
# how many references the call itself adds differs between Python versions (3.14 borrows
# some). A buffer any array still uses counts more.
_UNUSED = _references([np.empty(0, np.uint8)], 0)


def _new_buffer(nbytes: int) -> np.ndarray:
    """`nbytes` of fresh memory: an anonymous mapping of its own, in ordinary pages.

    Not `np.empty`: NumPy advises the kernel to back large arrays with transparent huge
    pages (MADV_HUGEPAGE), and under Linux's common setting for them (`defrag` of
    `madvise`), faulting such memory in while no huge page is free stalls the task on
    synchronous memory compaction (numpy/numpy#31590). Measured on a 2-core worker: a
    25 MB block took 50 to 85 ms to fault in and decode that way, 18 to 20 ms in ordinary
    pages. The views handed out keep this array (their `base`) and it keeps the mapping,
    which is unmapped when the last of them goes."""
    if hasattr(mmap, "MAP_PRIVATE"):  # POSIX: private, as malloc's memory is (a forked
        # child gets a copy on write, not the parent's pages: mmap's default is MAP_SHARED)
        memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:  # Windows: a section of the paging file, private to this process
        memory = mmap.mmap(-1, nbytes)
    return np.frombuffer(memory, np.uint8)


class BufferPool:
    """Chunk-sized buffers of one process, shared by its threads."""

    def __init__(self, limit: int):
        # Without the GIL a reference count read while other threads change it can come out
        # low, and a buffer in use would look free: no pool there.
        self.limit = limit if getattr(sys, "_is_gil_enabled", lambda: True)() else 0
        self._lock = threading.Lock()
        self._buffers: list[np.ndarray] = []  # uint8 arrays over their own mappings
        self._free_since: dict[int, float] = {}  # id(buffer) -> when first seen free
        self._trimmer: threading.Thread | None = None
        self.made = self.reused = 0  # buffers allocated; hand-outs of a free one

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized array like `np.empty(shape, dtype)`, from a free buffer when
        there is one."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if dtype.subdtype is not None:  # ("f4", (4,)): NumPy appends the subarray's axes
            dtype, shape = dtype.base, shape + dtype.shape
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < MIN_BYTES or self.limit <= 0 or dtype.hasobject:
            return np.empty(shape, dtype)
        with self._lock:
            buffer = self._take(nbytes)
        return buffer[:nbytes].view(dtype).reshape(shape)

    def _take(self, nbytes: int) -> np.ndarray:
        """The smallest free buffer that fits (with SLACK), else a new one."""
        sizes = [b.nbytes for b in self._buffers]
        found = None
        for i, size in enumerate(sizes):
            if nbytes <= size <= nbytes * SLACK and (found is None or size < sizes[found]) \
                    and _references(self._buffers, i) == _UNUSED:
                found = i
        if found is None:
            best = _new_buffer(-(-nbytes // PAGE) * PAGE)
            self._buffers.append(best)
            self.made += 1
            self._start_trimmer()
        else:
            best = self._buffers[found]
            self.reused += 1
        self._free_since.pop(id(best), None)
        self._release_free()  # buffers freed since the last call may be over the limit
        return best

    def held_bytes(self) -> int:
        """Bytes of the pool's buffers, in use or free."""
        with self._lock:
            return sum(b.nbytes for b in self._buffers)

    def free_bytes(self) -> int:
        """Bytes of the buffers no array uses."""
        with self._lock:
            return sum(b.nbytes for b in self._free())

    def _free(self) -> list[np.ndarray]:
        """The free buffers; notes when each was first seen free (idle time counts from
        then, not from when it was handed out)."""
        now = time.monotonic()
        free = [self._buffers[i] for i in range(len(self._buffers))
                if _references(self._buffers, i) == _UNUSED]
        seen = {id(b) for b in free}
        self._free_since = {i: t for i, t in self._free_since.items() if i in seen}
        for b in free:
            self._free_since.setdefault(id(b), now)
        return free

    def _release_free(self, idle: float | None = None, limit: int | None = None) -> None:
        """Drop free buffers, the longest free first, until at most `limit` (the pool's
        limit) bytes of them are left, and every one free for more than `idle` seconds."""
        now = time.monotonic()
        limit = self.limit if limit is None else limit
        free = sorted(self._free(), key=lambda b: self._free_since[id(b)],
                      reverse=True)  # the most recently freed are kept
        kept = 0
        drop = set()
        for buffer in free:
            old = idle is not None and now - self._free_since[id(buffer)] > idle
            if old or kept + buffer.nbytes > limit:
                drop.add(id(buffer))
            else:
                kept += buffer.nbytes
        del free
        if drop:
            self._buffers = [b for b in self._buffers if id(b) not in drop]
            for i in drop:
                self._free_since.pop(i, None)

    def clear(self) -> None:
        """Release every free buffer now."""
        with self._lock:
            self._release_free(limit=0)

    def release_idle(self, seconds: float) -> None:
        """Release the free buffers free for more than `seconds`, and the longest free ones
        while more than `limit` bytes are free. (Buffers come free whenever their arrays
        go; this, run every TRIM_SECONDS, and every allocation bring them under the limit.)"""
        with self._lock:
            self._release_free(idle=seconds)

    def _start_trimmer(self) -> None:
        if self._trimmer is None or not self._trimmer.is_alive():
            # The thread holds the pool weakly: a pool nothing else holds goes, buffers and all.
            self._trimmer = threading.Thread(target=_trim_while_held, args=(weakref.ref(self),),
                                             daemon=True, name="deepx-buffer-trim")
            self._trimmer.start()


def _trim_while_held(pool_ref) -> None:
    while True:
        time.sleep(TRIM_SECONDS)
        pool = pool_ref()
        if pool is None:
            return
        pool.release_idle(IDLE_SECONDS)
        with pool._lock:
            if not pool._buffers:
                pool._trimmer = None
                return
        del pool


def default_limit() -> int:
    """DEEPX_BUFFER_POOL_BYTES, else a tenth of this worker's memory limit (of the machine's
    memory outside a worker or for a worker without a limit)."""
    from deepx_flow.config import settings
    limit = settings().buffer_pool_bytes
    if limit is not None:
        return limit
    memory_limit = None
    try:
        from distributed import get_worker
        memory_limit = get_worker().memory_manager.memory_limit
    except (ImportError, ValueError, AttributeError):
        pass  # not on a Dask worker
    if not memory_limit:
        memory_limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(memory_limit) // 10


_pool: BufferPool | None = None
_pool_lock = threading.Lock()


def pool() -> BufferPool:
    """This process's pool (made on first use, sized from the worker it runs in)."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = BufferPool(default_limit())
    return _pool


def empty(shape, dtype) -> np.ndarray:
    """`np.empty(shape, dtype)`, in recycled memory when the array is chunk-sized."""
    return pool().empty(shape, dtype)
