"""A `.npy` input three times a worker's memory limit, reduced to small outputs.

Why: deepx_flow sizes chunks from each worker's registered memory, so a graph over an input
larger than any worker's memory must run chunk by chunk, reading the file on the workers,
without a worker crossing its limit (Dask's nanny kills a worker at 95% of it). This measures
the peak resident memory of the workers against the limit, the run time and the result
against NumPy, and does the same with dask.array for comparison.

Setup: a float32 `.npy` file of 3 x the limit (rows x 256) in a temporary folder; a
LocalCluster of 2 worker processes x 1 thread with `memory_limit` each (400 MiB; 256 MiB with
--quick); the graph `tanh(x * 0.5 + 0.1).mean(axis=0)` and `x.max(axis=0)`. Worker RSS is
sampled with `client.run` every 50 ms during the run, and each worker's own high-water mark
(VmHWM, which no spike escapes) is read at the end; the peak is the larger of the two. The
file is fresh in the page cache, so this measures memory and scheduling, not disk speed.

dask.array runs the same expression over `da.from_array` on a reader that opens the file with
`np.load(mmap_mode="r")` on the worker (the array itself never travels in the graph), with
dask's automatic chunks and with deepx_flow's chunk shape, each on a fresh cluster with the
same limit; a worker killed for memory fails the run at once (allowed-failures 0).

Run: `python benchmarks/bench_larger_than_memory.py [--quick]`.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

import common
import deepx_flow as dx

COLS = 256
BLOCK = 200_000  # rows written and checked at a time, so this process stays small too


class NpyReader:
    """An array-like over a `.npy` file that reads only the slices asked for."""

    def __init__(self, path):
        self.path = str(path)
        head = np.load(self.path, mmap_mode="r")
        self.shape, self.dtype, self.ndim = head.shape, head.dtype, head.ndim

    def __getitem__(self, index):
        return np.array(np.load(self.path, mmap_mode="r")[index])


def write_input(path: Path, rows: int) -> None:
    data = np.lib.format.open_memmap(path, mode="w+", dtype="float32", shape=(rows, COLS))
    rng = np.random.default_rng(1)
    for start in range(0, rows, BLOCK):
        stop = min(rows, start + BLOCK)
        data[start:stop] = rng.standard_normal((stop - start, COLS), dtype="float32")
    data.flush()


def expected(path: Path, rows: int):
    ref = np.load(path, mmap_mode="r")
    total, peak = np.zeros(COLS), np.full(COLS, -np.inf)
    for start in range(0, rows, BLOCK):
        block = np.asarray(ref[start:start + BLOCK], dtype="float64")
        total += np.tanh(block * 0.5 + 0.1).sum(axis=0)
        peak = np.maximum(peak, block.max(axis=0))
    return total / rows, peak.astype("float32")


def run_deepx(path: Path, rows: int, limit: int) -> dict:
    x = dx.input("x", (rows, COLS), "float32")
    outputs = [dx.tanh(x * 0.5 + 0.1).mean(axis=0), x.max(axis=0)]
    with common.local_cluster(2, memory_limit=limit) as client:
        plan = dx.compile(outputs, client=client)
        with common.RssSampler(client) as rss:
            start = time.perf_counter()
            got = dx.run(outputs, inputs={"x": str(path)}, client=client)
            elapsed = time.perf_counter() - start
        hwm = max(client.run(common.peak_rss).values())
    chunks = plan.chunks["x"]
    return {"seconds": elapsed, "peak_rss_sampled": rss.peak, "rss_samples": rss.samples,
            "peak_rss": max(rss.peak, hwm), "peak_rss_hwm": hwm, "result": got,
            "input_chunks": len(chunks[0]), "input_chunk_shape": [max(c) for c in chunks],
            "task_budget": plan.partition.budget, "tasks": plan.stats().tasks}


def run_dask(path: Path, limit: int, chunks) -> dict:
    import dask
    import dask.array as da
    x = da.from_array(NpyReader(path), chunks=chunks, name=f"npy-input-{chunks}")
    mean, peak = da.tanh(x * 0.5 + 0.1).mean(axis=0), x.max(axis=0)
    # One killed worker already means the limit was crossed: fail at once, not after retries.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            common.local_cluster(2, memory_limit=limit, logs=logging.CRITICAL) as client:
        with common.RssSampler(client) as rss:
            start = time.perf_counter()
            try:
                got, error = dask.compute(mean, peak), None
            except Exception as err:  # a worker killed for memory ends the run here
                got, error = None, f"{type(err).__name__}: {err}"[:300]
            elapsed = time.perf_counter() - start
        hwm = max(client.run(common.peak_rss).values(), default=0)  # live workers only
    return {"seconds": elapsed, "peak_rss_sampled": rss.peak, "rss_samples": rss.samples,
            "peak_rss": max(rss.peak, hwm), "peak_rss_hwm": hwm,
            "result": got, "error": error, "input_chunks": len(x.chunks[0]),
            "input_chunk_shape": list(x.chunksize)}


def main(quick: bool = False) -> dict:
    limit = (256 if quick else 400) * 2**20
    rows = -(-3 * limit // (COLS * 4))
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"memory_limit_per_worker": limit, "rows": rows, "cols": COLS,
                          "dtype": "float32", "workers": 2, "threads_per_worker": 1,
                          "rss_sample_interval_s": 0.05}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.npy"
        write_input(path, rows)
        res["parameters"]["input_bytes"] = path.stat().st_size
        want_mean, want_max = expected(path, rows)
        engines = {"deepx_flow": run_deepx(path, rows, limit)}
        engines["dask.array (auto chunks)"] = run_dask(path, limit, "auto")
        same = tuple(engines["deepx_flow"]["input_chunk_shape"])
        engines["dask.array (deepx chunks)"] = run_dask(path, limit, same)

    rows_out = []
    for label, r in engines.items():
        got = r.pop("result")
        r["correct"] = got is not None and bool(
            np.allclose(got[0], want_mean, rtol=1e-4) and np.array_equal(got[1], want_max))
        r["peak_rss_fraction_of_limit"] = r["peak_rss"] / limit
        rows_out.append((label, common.fmt(r["seconds"], 2), f"{r['input_chunks']}",
                         f"{r['peak_rss'] / 2**20:.0f}", f"{limit / 2**20:.0f}",
                         common.fmt(r["peak_rss_fraction_of_limit"]),
                         "yes" if r["correct"] else f"no: {r.get('error') or ''}"[:30]))
    res.update(engines)
    common.print_table(("", "seconds", "chunks", "peak RSS MiB", "limit MiB", "of limit",
                        "correct"), rows_out,
                       f"{res['parameters']['input_bytes'] / 2**20:.0f} MiB .npy input, 2 workers "
                       f"x {limit / 2**20:.0f} MiB")
    d = engines["deepx_flow"]
    ok = d["correct"] and 0 < d["peak_rss"] < limit
    res["targets"] = {"deepx_peak_rss_below_limit_and_correct": common.target(
        "peak worker RSS / limit < 1 and results equal NumPy's",
        d["peak_rss_fraction_of_limit"], ok)}
    common.write_results("bench_larger_than_memory", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB workers, 768 MiB input")
    main(parser.parse_args().quick)
