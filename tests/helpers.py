"""Helpers shared by the tests: small cluster specs that force chunk grids, a free port,
comparing sums within the precision their terms allow, the peak memory of a cluster's
workers while a block runs, and a file made unreadable for real."""

from __future__ import annotations

import contextlib
from html.parser import HTMLParser
import socket
import threading
import time

import numpy as np

from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec


def cluster_with_memory(memory: int, workers: int = 2, threads: int = 1) -> ClusterSpec:
    """A CPU cluster description whose per-task budget is memory * fraction / threads."""
    return ClusterSpec(f"test-{memory}", tuple(
        WorkerSpec(f"w{i}", "localhost", threads, memory) for i in range(workers)))


class Cells(HTMLParser):
    """The text of every table cell and the tags seen, from a repr's HTML."""

    def __init__(self, text: str):
        super().__init__()
        self.cells, self.tags, self._cell = [], [], None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.cells.append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def remove_runs(db, *run_ids: str) -> None:
    """Delete runs a test added, with their tasks and events (those first)."""
    from sqlmodel import col, select

    from deepx_flow.meta.models import Event, Run, Task
    with db.session() as session:
        for model in (Task, Event):
            for row in session.exec(select(model).where(col(model.run_id).in_(run_ids))):
                session.delete(row)
        session.flush()
        for run_id in run_ids:
            session.delete(session.get(Run, run_id))


def without_run_headers(stderr: str) -> list[str]:
    """The lines of a CLI command's stderr but the "deepx_flow run <id>: ..." lines (or
    "deepx_flow materialize <id>: ...") it prints as each run starts (`runtime/progress.py`)."""
    import re
    return [line for line in stderr.splitlines()
            if not re.match(r"deepx_flow \w+ [0-9a-f]{32}: ", line)]


class faults_on:
    """Install fault rules (`kernels/faults.py`) on every worker for a `with` block;
    removing them releases any task they hung."""

    def __init__(self, client, *rules):
        self.client, self.rules = client, rules

    def __enter__(self):
        from deepx_flow.kernels.faults import FaultInjection
        self.client.register_plugin(FaultInjection(self.rules))

    def __exit__(self, *exc):
        from deepx_flow.kernels.faults import FaultInjection
        self.client.unregister_worker_plugin(FaultInjection.name)


def threaded_memory_off():
    """Dask settings to make LocalClusters of threaded workers (processes=False) under.

    Dask's memory manager measures the whole process, which for threaded workers is the test
    process and everything earlier tests left in it: at 80% of a 1 GiB limit it paused the
    workers, and a run waited on them until the test timed out. Their memory is not theirs
    to manage. (Workers read these settings when they are made.)"""
    import dask
    return dask.config.set({f"distributed.worker.memory.{k}": False
                            for k in ("target", "spill", "pause", "terminate")})


@contextlib.contextmanager
def unreadable(path):
    """`path` made unreadable (mode 000) to this thread while the block runs: a real
    permission error from the file system. Root reads anything through its capabilities
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so as root they are dropped from this
    thread's effective set (capset, per thread) and given back after; the test is skipped
    where that cannot be done. Other threads (Zarr's I/O, threaded workers) keep them."""
    import ctypes
    import os

    import pytest

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    version_3, dac = 0x20080522, (1 << 1) | (1 << 2)  # linux/capability.h
    saved = None
    if os.geteuid() == 0:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            saved = (Data * 2)()
            if libc.capget(ctypes.byref(Header(version_3, 0)), saved) != 0:
                raise OSError(ctypes.get_errno(), "capget")
            dropped = (Data * 2)(*[Data(d.effective, d.permitted, d.inheritable)
                                   for d in saved])
            dropped[0].effective &= ~dac
            if libc.capset(ctypes.byref(Header(version_3, 0)), dropped) != 0:
                raise OSError(ctypes.get_errno(), "capset")
        except (OSError, AttributeError) as err:
            pytest.skip(f"running as root, and its file capabilities cannot be dropped: {err}")
    mode = os.stat(path).st_mode
    os.chmod(path, 0)
    try:
        yield
    finally:
        os.chmod(path, mode)
        if saved is not None:
            libc.capset(ctypes.byref(Header(version_3, 0)), saved)


def reader_counts(reader, damage_once) -> dict:
    """Call `damage_once` (cut a file and write it back) over and over while the reader
    subprocess runs (from its first line, "reading", to its exit); then the counts (JSON,
    its last line) it printed. A reader killed by a signal (SIGBUS from a mapped file cut
    short) fails the test by the signal's name."""
    import json
    import signal
    try:
        assert reader.stdout.readline().strip() == "reading"
        while reader.poll() is None:
            damage_once()
        out = reader.stdout.read()
    finally:
        if reader.poll() is None:
            reader.kill()
        reader.wait()
    assert reader.returncode == 0, (
        f"the reader died of {signal.Signals(-reader.returncode).name}"
        if reader.returncode < 0 else f"the reader exited with {reader.returncode}")
    return json.loads(out.splitlines()[-1])

def race_counts(start_reader, damage_once, rounds: int = 12) -> dict:
    """`reader_counts` of readers started by `start_reader()`, one after another, summed,
    until reads have seen both the whole file ("same") and its damage ("error"), or
    `rounds` readers ran: whether a read lands while a file is cut is timing, which differs
    between a busy machine and a quiet one."""
    total = {"same": 0, "error": 0, "wrong": 0}
    for _ in range(rounds):
        for key, n in reader_counts(start_reader(), damage_once).items():
            total[key] = total.get(key, 0) + n
        if total["same"] and total["error"]:
            break
    return total


def free_port() -> int:
    """A loopback port nothing listens on now (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_sums_close(actual, expected, terms, rtol: float = 1e-12) -> None:
    """`actual` equals `expected` (float64 sums or products: NumPy's) within `rtol` of
    `terms`, the sum of the absolute values of the terms each element adds up. A sum that
    cancels is exact only to the size of its terms, not of its result: two summation orders
    of the same numbers can differ by far more than `rtol` times a result near zero."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    bound = rtol * np.broadcast_to(np.asarray(terms, dtype=np.float64), actual.shape)
    error = np.abs(actual - expected)
    bad = error > bound
    if bad.any():
        at = np.unravel_index(np.argmax(np.where(bad, error / np.maximum(bound, 1e-300), 0)),
                              actual.shape)
        raise AssertionError(f"{int(bad.sum())} of {actual.size} elements differ by more "
                             f"than {rtol:g} of their terms; worst at {at}: {actual[at]!r} vs "
                             f"{expected[at]!r} (terms {bound[at] / rtol:.3g})")


def exact_sum(x, axis=None, keepdims: bool = False) -> np.ndarray:
    """The sum of `x` along `axis`, correctly rounded to float64 (math.fsum along the axis):
    the reference sums of low-precision floats are checked against."""
    import math

    x = np.asarray(x, dtype=np.float64)
    axes = tuple(range(x.ndim)) if axis is None else tuple(np.atleast_1d(axis))
    kept = [a for a in range(x.ndim) if a not in axes]
    rows = np.moveaxis(x, list(axes), list(range(x.ndim - len(axes), x.ndim)))
    rows = rows.reshape(tuple(x.shape[a] for a in kept) + (-1,))
    out = np.array([math.fsum(r) for r in rows.reshape(-1, rows.shape[-1])]).reshape(
        rows.shape[:-1])
    if keepdims:
        out = out.reshape(tuple(1 if a in axes else s for a, s in enumerate(x.shape)))
    return out


def assert_within_ulps(actual, expected, ulps: float = 1) -> None:
    """`actual` is within `ulps` units in the last place of `expected` in `actual`'s dtype:
    `expected` (a float64 reference) rounded once to that dtype, give or take `ulps` steps."""
    actual = np.asarray(actual)
    rounded = np.asarray(expected, dtype=np.float64).astype(actual.dtype)
    assert actual.shape == rounded.shape, (actual.shape, rounded.shape)
    step = np.spacing(np.abs(rounded)).astype(np.float64)
    error = np.abs(actual.astype(np.float64) - rounded.astype(np.float64))
    bad = error > ulps * step
    if bad.any():
        at = np.unravel_index(np.argmax(np.where(bad, error / step, 0)), actual.shape)
        raise AssertionError(f"{int(bad.sum())} of {actual.size} elements are more than "
                             f"{ulps:g} ulp from the reference rounded to {actual.dtype}; worst "
                             f"at {at}: {actual[at]!r} vs {rounded[at]!r} "
                             f"({error[at] / step[at]:.3g} ulp)")


def rows_of_infinities() -> np.ndarray:
    """A (6, 4) float32 block whose rows hold +inf, one -inf, all -inf, a NaN and zeros: the
    edge cases of a softmax along its rows."""
    x = np.zeros((6, 4), np.float32)
    x[0] = np.inf
    x[1, 0] = -np.inf
    x[2] = -np.inf
    x[3, 1] = np.nan
    return x


class WorkerRss:
    """`with WorkerRss(client) as rss:` samples the largest resident memory of any of the
    client's workers every `interval` seconds while the block runs; `rss.peak` is it (0 if
    no sample came back)."""

    def __init__(self, client, interval: float = 0.05):
        self.client, self.interval, self.peak = client, interval, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._done.is_set():
            with contextlib.suppress(Exception):  # a worker restarting answers nothing
                self.peak = max(self.peak, *self.client.run(_rss).values())
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def _rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


# Go builds offline: the standard library only (no module proxy is reachable from CI).
GO_OFFLINE = {"GOFLAGS": "-mod=mod", "GOPROXY": "off"}


def toolchain(name: str) -> str:
    """The path of an SDK's tool (`node`, `go`); the test skips where it is not installed,
    or fails where DEEPX_REQUIRE_SDK_TOOLCHAINS says it must be (as .ci/run does)."""
    import os
    import shutil

    import pytest
    found = shutil.which(name)
    if found is None:
        if os.environ.get("DEEPX_REQUIRE_SDK_TOOLCHAINS"):
            pytest.fail(f"{name} is not installed (DEEPX_REQUIRE_SDK_TOOLCHAINS is set)")
        pytest.skip(f"{name} is not installed")
    return found


def _process_rss() -> int:
    import os

    import psutil
    return psutil.Process(os.getpid()).memory_info().rss


@contextlib.contextmanager
def worker_memory_sampled(client, every_s: float = 0.05):
    """Yield a dict that fills, while the block runs, with each worker's highest resident
    memory sampled every `every_s`; on leaving, assert that no worker was restarted (a
    worker the nanny restarts at its memory limit comes back under a new address)."""
    peak: dict = {}
    stop = threading.Event()
    workers = set(client.scheduler_info(n_workers=-1)["workers"])

    def sample():
        while not stop.wait(every_s):
            try:
                for worker, rss in client.run(_process_rss).items():
                    peak[worker] = max(peak.get(worker, 0), rss)
            except Exception:  # a sample while a worker restarts: the next one tells
                pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join(10)
    assert set(client.scheduler_info(n_workers=-1)["workers"]) == workers, \
        "a worker was restarted"
