"""The buffer pool (`kernels/recycled.py`): an array from it never shares memory with an array
still in use, however it was viewed, sliced or sent to another thread; a buffer is handed out
again once nothing refers to it; free buffers stay under the limit and idle ones go."""

import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deepx_flow.errors import SettingsError
from deepx_flow.kernels import recycled
from deepx_flow.kernels.recycled import MIN_BYTES, BufferPool

MiB = 1 << 20
ROWS = 1024  # float32 rows of 4 KiB: MIN_BYTES is 1024 of them


def _rows(pool, n, value):
    a = pool.empty((n, ROWS), np.float32)
    a[...] = value
    return a


def test_small_arrays_and_a_pool_turned_off_are_plain_numpy():
    pool = BufferPool(limit=1 << 30)
    small = pool.empty((10, 10), np.float64)
    assert small.base is None and small.shape == (10, 10)
    off = BufferPool(limit=0)
    big = off.empty((2 * MIN_BYTES // 8,), np.float64)
    assert big.base is None and off.held_bytes() == 0


def test_a_freed_buffer_is_handed_out_again_and_a_kept_view_holds_it():
    pool = BufferPool(limit=1 << 30)
    a = pool.empty((MIN_BYTES // 4,), np.float32)
    first = id(a.base)
    del a
    b = pool.empty((MIN_BYTES // 4,), np.int32)  # same bytes, another dtype
    assert id(b.base) == first and b.dtype == np.int32
    view = b[10:20].reshape(2, 5).T  # a view of a view still holds the buffer
    del b
    c = pool.empty((MIN_BYTES // 4,), np.float32)
    assert id(c.base) != first and not np.shares_memory(c, view)
    assert pool.held_bytes() == 2 * MIN_BYTES


def test_a_memoryview_holds_its_buffer():
    pool = BufferPool(limit=1 << 30)
    a = pool.empty((MIN_BYTES,), np.uint8)
    m = memoryview(a)
    del a
    b = pool.empty((MIN_BYTES,), np.uint8)
    b[...] = 7
    assert not np.shares_memory(np.frombuffer(m, np.uint8), b)


def test_free_buffers_stay_under_the_limit_the_longest_free_going_first():
    pool = BufferPool(limit=3 * MIN_BYTES)
    arrays = [pool.empty((MIN_BYTES,), np.uint8) for _ in range(5)]
    ids = [id(a.base) for a in arrays]
    assert pool.free_bytes() == 0 and pool.held_bytes() == 5 * MIN_BYTES
    for _ in range(5):  # freed one at a time, the pool noticing each
        arrays.pop(0)
        pool.free_bytes()
        time.sleep(0.01)
    assert pool.free_bytes() == 5 * MIN_BYTES  # over the limit until the next trim
    bigger = pool.empty((2 * MIN_BYTES,), np.uint8)  # no free one fits: a new one, and a trim
    assert pool.free_bytes() <= 3 * MIN_BYTES and bigger.base is not None
    kept = [id(b) for b in pool._buffers]
    assert set(kept) & set(ids) == set(ids[2:])  # the last freed are kept


def test_idle_buffers_are_released_counting_from_when_they_came_free():
    pool = BufferPool(limit=1 << 30)
    a = pool.empty((MIN_BYTES,), np.uint8)
    b = pool.empty((MIN_BYTES,), np.uint8)
    time.sleep(0.3)  # held a while: that is not idleness
    del a
    pool.release_idle(0.2)
    assert pool.held_bytes() == 2 * MIN_BYTES
    time.sleep(0.3)
    pool.release_idle(0.2)
    assert pool.held_bytes() == MIN_BYTES  # `b` is in use: kept
    del b
    pool.clear()
    assert pool.held_bytes() == 0


def test_a_pool_nothing_holds_goes_with_its_trimmer():
    pool = BufferPool(limit=1 << 30)
    a = pool.empty((MIN_BYTES,), np.uint8)
    probe = weakref.ref(pool)
    del pool, a
    gc.collect()
    assert probe() is None


def test_subarray_dtypes_get_numpy_shapes():
    pool = BufferPool(limit=1 << 30)
    a = pool.empty((MIN_BYTES // 16,), np.dtype(("f4", (4,))))
    assert a.shape == np.empty((MIN_BYTES // 16,), np.dtype(("f4", (4,)))).shape
    assert a.dtype == np.float32 and a.base is not None


def test_a_bad_limit_setting_is_named(monkeypatch):
    monkeypatch.setenv("DEEPX_BUFFER_POOL_BYTES", "lots")
    with pytest.raises(SettingsError, match="DEEPX_BUFFER_POOL_BYTES"):
        recycled.default_limit()
    monkeypatch.setenv("DEEPX_BUFFER_POOL_BYTES", "12345")
    assert recycled.default_limit() == 12345


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["new", "drop", "view"]),
                          st.integers(1, 3 * ROWS), st.integers(0, 10**6)),
                min_size=1, max_size=40),
       st.sampled_from([0, 2 * MIN_BYTES, 64 * MIN_BYTES]))
def test_live_arrays_never_share_memory_and_keep_their_values(steps, limit):
    pool = BufferPool(limit=limit)
    live: list[tuple[np.ndarray, int]] = []  # (an array or a view of one, which array)
    made = 0
    for what, rows, pick in steps:
        if what == "new":
            live.append((_rows(pool, rows, made), made))
            made += 1
        elif live and what == "view":
            a, origin = live[pick % len(live)]
            live.append((a[len(a) // 2:].T, origin))
        elif live:  # drop an array or a view
            live.pop(pick % len(live))
    for i, (a, origin) in enumerate(live):
        assert (a == origin).all()  # nothing else wrote over it
        for b, other in live[i + 1:]:
            if other != origin:
                assert not np.shares_memory(a, b)
    pool.clear()


def test_threads_allocating_at_once_get_separate_memory():
    pool = BufferPool(limit=8 * MIN_BYTES)
    errors = []

    def work(tag):
        for i in range(50):
            a = _rows(pool, ROWS + (tag * 7 + i) % 300, tag * 1000 + i)
            b = _rows(pool, ROWS, -(tag * 1000 + i))
            if not ((a == tag * 1000 + i).all() and (b == -(tag * 1000 + i)).all()):
                errors.append((tag, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    pool.clear()


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["float32", "float64", "float16", "int64", "uint8", "bool", "int16"]),
       st.sampled_from(["float32", "float64", "int32", "uint64", "bool"]),
       st.booleans(), st.integers(0, 1))
def test_chunk_sized_joins_match_numpy(first, second, fortran, axis):
    """`kernels.tasks._concatenate` (blocks assembled into one operand) writes into a pooled
    array: the same values, dtype and memory order as `np.concatenate`."""
    from deepx_flow.kernels.tasks import _concatenate
    rng = np.random.default_rng(0)
    rows = MIN_BYTES // 512  # joined: over MIN_BYTES for every dtype pair
    blocks = [(rng.standard_normal((rows, 512)) * 50).astype(first),
              (rng.standard_normal((rows, 512)) * 50).astype(second)]
    if fortran:
        blocks = [np.asfortranarray(b) for b in blocks]
    got = _concatenate(np, blocks, axis)
    want = np.concatenate(blocks, axis=axis)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.flags.f_contiguous == want.flags.f_contiguous
    np.testing.assert_array_equal(got, want)


def _mapping_flags(address: int) -> list[str] | None:
    """The VmFlags of this process's mapping that holds `address` (None if none does)."""
    entry = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                entry = lo <= address < hi
            elif head == "VmFlags:" and entry:
                return line.split()[1:]
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"),
                    reason="reads Linux's /proc/self/smaps")
def test_buffers_are_mappings_of_their_own_not_advised_for_huge_pages():
    """A pooled buffer is fresh anonymous memory in ordinary pages: NumPy's own large arrays
    are advised for transparent huge pages (MADV_HUGEPAGE, flag `hg`), which can stall on
    memory compaction as they fault in; and the mapping goes when the pool lets it go."""
    pool = BufferPool(limit=1 << 30)
    a = pool.empty((4 * MIN_BYTES // 4,), np.float32)
    a[...] = 1.5  # faulted in, writable
    address = a.__array_interface__["data"][0] + a.nbytes // 2  # (NumPy advises whole pages)
    flags = _mapping_flags(address)
    assert flags is not None and "hg" not in flags
    numpy_advises = getattr(np, "_core", getattr(np, "core", None)).multiarray \
        ._get_madvise_hugepage()
    if numpy_advises and os.path.exists("/sys/kernel/mm/transparent_hugepage"):
        # the contrast this guards against
        plain = np.empty(4 * MIN_BYTES // 4, np.float32)
        middle = plain.__array_interface__["data"][0] + plain.nbytes // 2
        assert "hg" in (_mapping_flags(middle) or [])
    assert float(a.sum(dtype=np.float64)) == 1.5 * a.size
    del a
    pool.clear()
    gc.collect()
    assert pool.held_bytes() == 0 and _mapping_flags(address) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_a_copy_of_a_buffer_not_the_parents_memory():
    """Buffers are private mappings, as malloc's memory is: a child process forked while an
    array lives writes to its own copy (mmap's default, a shared mapping, let the child's
    writes show in the parent)."""
    pool = BufferPool(limit=1 << 30)
    a = pool.empty((MIN_BYTES // 4,), np.float32)
    a[...] = 1.0
    pid = os.fork()
    if pid == 0:  # the child: write, and leave at once
        a[...] = 42.0
        os._exit(0 if a[0] == 42.0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert float(a.min()) == float(a.max()) == 1.0
    address = a.__array_interface__["data"][0] + a.nbytes // 2
    flags = _mapping_flags(address) if os.path.exists("/proc/self/smaps") else []
    assert "sh" not in (flags or [])
