"""Helpers shared by the benchmark scripts: timing, tables, JSON results, reference figures.

- `best_of`: best-of-N wall time after warm-up runs.
- `copy_bandwidth`: the machine's memory-copy bandwidth (`np.copyto` of a large array, bytes
  read plus bytes written per second), the ceiling for any memory-bound kernel.
- `comm_stream`: compute and communication measured on the cluster during a block: the sums
  of the 'compute' and the 'transfer' intervals of `distributed.get_task_stream`, the transfer
  time during which the receiving worker computed nothing (not overlapped), and the bytes the
  workers received (their `transfer_incoming_log`).
- `interleaved`: contenders timed round-robin, so that a noisy shared machine hits all alike.
- `worker_counters`: the workers' user and system CPU seconds and minor page faults.
- `local_cluster`: the LocalCluster every benchmark uses (worker processes, one thread each,
  no dashboard).
- `print_table`, `write_results`, `machine_info`: output. Results go to
  `benchmarks/results/<name>.json` with the machine, the parameters, every measured number
  and the targets; infinities are written as the string "inf" (JSON has no infinity).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import platform
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask
import numpy as np

# A worker the benchmarks kill is waited for as long as its restart takes: a LocalCluster
# closes the nanny of a worker not back within `lost-worker-timeout` (15 s), which a restart
# on a busy machine can pass, and the runs after have a worker fewer (the recovery
# benchmark's quick run then waited past the suite's 300 s).
dask.config.set({"distributed.deploy.lost-worker-timeout": "300s"})

RESULTS = Path(__file__).resolve().parent / "results"
GB = 1e9
GiB = 2**30


def machine_info() -> dict:
    """Cores, RAM, CPU model, library versions, the git revision and the date."""
    import dask
    import distributed
    import numexpr
    import psutil
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent).stdout.strip()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cores": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GiB, 1),
        "cpu": cpu, "platform": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "dask": dask.__version__,
        "distributed": distributed.__version__, "numexpr": numexpr.__version__,
        "git_revision": rev or None, "loadavg_at_start": os.getloadavg(),
    }


def wait_until_quiet(max_busy: float = 0.3, timeout: float = 900.0) -> float:
    """Wait (up to `timeout` s) until the machine's CPU use over 3 s is below `max_busy` (a
    fraction of all cores), so other people's jobs do not distort the timings; return the
    last measured fraction (also when the wait timed out)."""
    import psutil
    deadline = time.monotonic() + timeout
    while True:
        busy = psutil.cpu_percent(interval=3.0) / 100
        if busy <= max_busy or time.monotonic() > deadline:
            print(f"machine busy {busy:.0%} before timing"
                  + ("" if busy <= max_busy else " (gave up waiting for a quiet machine)"))
            return busy


def blas_info() -> dict:
    """NumPy's BLAS library and its thread count in this process (threadpoolctl if it is
    installed, else OpenBLAS's own `*get_num_threads*` through ctypes); with threadpoolctl,
    also the kernels OpenBLAS runs and the OPENBLAS_CORETYPE that may have chosen them."""
    info = {"library": np.show_config(mode="dicts")["Build Dependencies"]["blas"].get("name")}
    try:
        from threadpoolctl import threadpool_info
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            info.update(threads=pools[0]["num_threads"], source="threadpoolctl",
                        internal_api=pools[0].get("internal_api"),
                        kernels=pools[0].get("architecture"),
                        OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE"))
            return info
    except ImportError:
        info["note"] = "threadpoolctl is not installed; thread count read through ctypes"
    import ctypes
    with contextlib.suppress(OSError, AttributeError):
        paths = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                 if "openblas" in line.lower()}
        for path in paths:
            lib = ctypes.CDLL(path)
            for name in ("openblas_get_num_threads", "openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads"):
                if hasattr(lib, name):
                    info.update(threads=int(getattr(lib, name)()), source=f"ctypes {name}")
                    return info
    info.setdefault("threads", None)
    return info


def best_of(fn, repeat: int = 3, warmup: int = 1) -> dict:
    """Run `fn` warmup + repeat times (its result is dropped at once); return the best, the
    median and all timed seconds."""
    times = []
    for i in range(warmup + repeat):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return {"best_s": min(times), "median_s": sorted(times)[len(times) // 2], "times_s": times}


def interleaved(fns: dict, repeat: int = 3, warmup: int = 1, around=None) -> dict:
    """Time several contenders round-robin (A B C A B C ...) so that they see the same machine
    conditions; `fns[name]()` runs one timed call and returns a function that cleans up
    (untimed), or None. `around(name)`, if given, is a context manager entered just outside
    each timed call after the warm-up. Returns `{name: {"best_s", "median_s", "times_s"}}`."""
    times = {name: [] for name in fns}
    for i in range(warmup + repeat):
        for name, fn in fns.items():
            ctx = around(name) if around and i >= warmup else contextlib.nullcontext()
            with ctx:
                start = time.perf_counter()
                cleanup = fn()
                elapsed = time.perf_counter() - start
            if cleanup:
                cleanup()
            if i >= warmup:
                times[name].append(elapsed)
    return {name: {"best_s": min(t), "median_s": sorted(t)[len(t) // 2], "times_s": t}
            for name, t in times.items()}


def _proc_counters() -> dict:
    """This process's CPU seconds (user, system) and minor page faults (/proc/self/stat)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"user_s": int(fields[11]) / ticks, "system_s": int(fields[12]) / ticks,
            "minor_faults": int(fields[7])}


@contextlib.contextmanager
def worker_counters(client, into: dict):
    """Add to `into` the CPU seconds (user, system) and minor page faults all workers spent
    inside the block: system time and page faults show what fresh memory costs."""
    before = client.run(_proc_counters)
    yield into
    after = client.run(_proc_counters)
    for key in ("user_s", "system_s", "minor_faults"):
        into[key] = into.get(key, 0) + sum(after[w][key] - before[w][key] for w in after)


def copy_bandwidth(nbytes: int = GiB, threads: int = 1, repeat: int = 3) -> float:
    """Bytes read plus written per second by `np.copyto` of an `nbytes` array, in `threads`
    threads that each copy their own slice (np.copyto releases the GIL)."""
    src = np.ones(nbytes // 8)
    dst = np.zeros_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(p[0], p[-1] + 1) for p in parts]

    def copy(bound):
        lo, hi = bound
        np.copyto(dst[lo:hi], src[lo:hi])

    with ThreadPoolExecutor(threads) as pool:
        best = best_of(lambda: list(pool.map(copy, bounds)), repeat=repeat)["best_s"]
    return 2 * src.nbytes / best


@contextlib.contextmanager
def local_cluster(n_workers: int = 2, memory_limit="auto", logs: int = logging.ERROR,
                  threads: int = 1):
    """A LocalCluster of `n_workers` processes with `threads` threads each (one by default),
    and its Client; `logs` is the level below which Dask's logs are silenced."""
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=True,
                      memory_limit=memory_limit, dashboard_address=None,
                      silence_logs=logs) as cluster, Client(cluster) as client:
        yield client


def _incoming_transfers(dask_worker, since: float):
    return [(e["total"], e["duration"]) for e in dask_worker.transfer_incoming_log
            if e["start"] >= since]


@contextlib.contextmanager
def comm_stream(client, into: list):
    """Append to `into` what the cluster did inside the block, from the task stream: the
    seconds spent computing and transferring (sums of the 'compute' and 'transfer' intervals
    of all tasks), their ratio ("inf" when nothing moved), and the bytes the workers received
    (their `transfer_incoming_log`)."""
    from distributed import get_task_stream
    since = time.time()
    with get_task_stream(client) as stream:
        yield into
    compute = transfer = 0.0
    n_transfers = 0
    spans: dict = {}  # worker -> {"compute": [...], "transfer": [...]} intervals
    for record in stream.data:
        for ss in record["startstops"]:
            if ss["action"] in ("compute", "transfer"):
                spans.setdefault(record.get("worker"), {"compute": [], "transfer": []})[
                    ss["action"]].append((ss["start"], ss["stop"]))
            if ss["action"] == "compute":
                compute += ss["stop"] - ss["start"]
            elif ss["action"] == "transfer":
                transfer += ss["stop"] - ss["start"]
                n_transfers += 1
    # Transfer time during which the receiving worker computed nothing: what communication
    # cost the run, as opposed to fetching that overlapped with work.
    exposed = sum(_length(_minus(_union(w["transfer"]), _union(w["compute"])))
                  for w in spans.values())
    received = client.run(_incoming_transfers, since=since - 1.0)
    nbytes = sum(total for log in received.values() for total, _ in log)
    into.append({"tasks": len(stream.data), "compute_s": compute, "transfer_s": transfer,
                 "transfers": n_transfers, "transfer_bytes": nbytes,
                 "compute_comm_ratio": compute / transfer if transfer else math.inf,
                 "exposed_transfer_s": exposed,
                 "compute_exposed_comm_ratio": compute / exposed if exposed else math.inf})


def _union(intervals):
    """Sorted, non-overlapping intervals covering the same time as `intervals`."""
    out = []
    for start, stop in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def _minus(a, b):
    """Parts of the intervals `a` not covered by `b` (both as made by `_union`)."""
    out = []
    for start, stop in a:
        for b_start, b_stop in b:
            if b_stop <= start or b_start >= stop:
                continue
            if b_start > start:
                out.append((start, b_start))
            start = max(start, b_stop)
        if start < stop:
            out.append((start, stop))
    return out


def _length(intervals) -> float:
    return sum(stop - start for start, stop in intervals)


class RssSampler:
    """Samples the largest resident memory of any worker every `interval` seconds."""

    def __init__(self, client, interval: float = 0.05):
        self.client, self.interval = client, interval
        self.peak, self.samples = 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._done.is_set():
            with contextlib.suppress(Exception):
                self.peak = max(self.peak, *self.client.run(_rss).values())
                self.samples += 1
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


def peak_rss() -> int:
    """This process's peak resident memory since it started (VmHWM): unlike sampling, it
    cannot miss a short spike."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def fmt(x: float, digits: int = 2) -> str:
    """A number for a table: 'inf' for infinity, else fixed digits."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def print_table(headers, rows, title: str | None = None) -> None:
    """Print rows as a plain aligned table (first column left, the rest right)."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if title:
        print(f"\n{title}")

    def line(row):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths)))

    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))


def compute_comm_report(stats, measured: dict) -> dict:
    """Print the estimated (a `PlanStats`) and the measured (from `comm_stream`)
    compute/communication figures side by side; return both for the results file."""
    print_table(("compute/communication", "compute s", "comm s", "bytes", "ratio"), [
        ("estimated (plan.stats)", fmt(stats.compute_seconds, 3), fmt(stats.comm_seconds, 3),
         f"{stats.comm_bytes:.3g}", fmt(stats.compute_comm_ratio, 1)),
        ("measured (task stream)", fmt(measured["compute_s"], 3),
         fmt(measured["transfer_s"], 3), f"{measured['transfer_bytes']:.3g}",
         fmt(measured["compute_comm_ratio"], 1)),
        ("measured, not overlapped", fmt(measured["compute_s"], 3),
         fmt(measured["exposed_transfer_s"], 3), "",
         fmt(measured["compute_exposed_comm_ratio"], 1))])
    return {"estimated": {"compute_s": stats.compute_seconds, "comm_s": stats.comm_seconds,
                          "comm_bytes": stats.comm_bytes, "ratio": stats.compute_comm_ratio},
            "measured": measured}


def target(goal: str, value: float, met: bool, **extra) -> dict:
    """One target for the results file, printed as it is made."""
    print(f"target {goal}: {fmt(value)} {'met' if met else 'NOT met'}")
    return {"target": goal, "value": value, "met": bool(met), **extra}


def _jsonable(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def write_results(name: str, payload: dict, quick: bool = False) -> Path:
    """Write `payload` plus machine info to results/<name>.json (<name>.quick.json with
    --quick, so a smoke test never overwrites the recorded full-size results). A "machine"
    entry in `payload` (from `machine_info()` taken when the run started) wins."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'.quick' if quick else ''}.json"
    data = {"benchmark": name, "quick": quick, "machine": machine_info(), **payload}
    data["machine"] = {**data["machine"], "loadavg_at_end": os.getloadavg()}
    path.write_text(json.dumps(_jsonable(data), indent=2) + "\n")
    print(f"\nwrote {path.relative_to(RESULTS.parent.parent)}")
    return path
