"""Latency of small runs: `dx.run` of a graph of a few chunks on an existing client vs
dask.array's `compute()` of the same expression on the same client, taking turns.

Why: loops of small runs (training steps, notebook cells) must not be dominated by the
driver's overhead (planning, registering the cluster, recording, round trips to the
scheduler). A second run of the same graph reuses its plan (`runtime/plan_cache.py`) and the
cluster's registration (`registry/membership.py`), so it should cost no more than
dask.array's own `compute()`.

What runs: a 2-worker LocalCluster (processes, 1 thread each). Three float64 graphs, each as
deepx_flow and as dask.array, `(tanh(x) * 2 + 1).sum(axis=0)` of:
- "tiny": a 200 x 200 random normal tensor (2 x 2 chunks in dask.array): the time is
  nearly all overhead, the driver's and Dask's;
- "random": a 2000 x 2000 random normal tensor (2 x 2 chunks of 1000 x 1000 in dask.array);
- "zarr": a 2000 x 2000 Zarr array of 2 x 2 chunks (`dx.read_zarr` vs `da.from_zarr`).
The random numbers differ (deepx_flow's are counter-based, a function of the element's
index, which costs more per element than NumPy's generator). Runs are recorded in a fresh
SQLite file, as by default. Median of 30 (3 with --quick) after 3 warm-ups (1), all six taking
turns. Also recorded: the CPU time of this process per call (the driver, and the
LocalCluster's scheduler, which runs in it) and of the calling thread alone, and the
workers' compute time per run (from Dask's task stream, the median of 3 runs; one with
--quick), which tells the driver's overhead from the work itself.

Run: `python benchmarks/bench_small_runs.py [--quick]` (about 40 s; --quick about 10 s).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import dask.array as da
import numpy as np

import common
import deepx_flow as dx


def _timed(cpu: list, fn, *args):
    """A contender for `common.interleaved` that also notes, in `cpu`, the CPU seconds of
    this process (the driver, and the LocalCluster's scheduler, which runs in it) and of the
    calling thread alone: work, which waiting for the workers does not count."""
    def go():
        process, thread = time.process_time(), time.thread_time()
        fn(*args)  # the result is dropped: interleaved() takes a cleanup or None
        cpu.append((time.process_time() - process, time.thread_time() - thread))
    return go


def _worker_seconds(client, fn) -> float:
    """The seconds the workers spent computing tasks during `fn()` (Dask's task stream)."""
    from distributed import get_task_stream
    with get_task_stream(client) as stream:
        fn()
    return sum(s["stop"] - s["start"] for t in stream.data for s in t["startstops"]
               if s["action"] == "compute")


def main(quick: bool = False, repeat: int | None = None) -> dict:
    repeat = repeat or (3 if quick else 30)
    warmup = 1 if quick else 3  # --quick is a smoke test of every part, not a measurement
    tmp = tempfile.mkdtemp(prefix="deepx-bench-small-")
    os.environ["DEEPX_DB_URL"] = f"sqlite:///{tmp}/deepx.db"
    import zarr
    side = 2000
    path = os.path.join(tmp, "x.zarr")
    stored = zarr.create_array(path, shape=(side, side), chunks=(side // 2, side // 2),
                               dtype="float64")
    stored[:] = np.random.default_rng(0).standard_normal((side, side))
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"repeat": repeat, "warmup": warmup, "workers": 2,
                          "threads_per_worker": 1, "dtype": "float64",
                          "database": "sqlite (fresh file)"}}
    graphs = {}
    for name, n in (("tiny", 200), ("random", side)):
        x = dx.random.normal((n, n), seed=0, dtype="float64")
        xa = da.random.default_rng(0).standard_normal((n, n), chunks=(n // 2, n // 2))
        graphs[name] = ((dx.tanh(x) * 2 + 1).sum(axis=0), (da.tanh(xa) * 2 + 1).sum(axis=0))
    graphs["zarr"] = ((dx.tanh(dx.read_zarr(path)) * 2 + 1).sum(axis=0),
                      (da.tanh(da.from_zarr(path)) * 2 + 1).sum(axis=0))
    with common.local_cluster(2) as client:
        expected = (np.tanh(stored[:]) * 2 + 1).sum(axis=0)
        np.testing.assert_allclose(dx.run(graphs["zarr"][0], client=client), expected)
        np.testing.assert_allclose(graphs["zarr"][1].compute(), expected)
        fns, cpu = {}, {}
        for name, (y, ya) in graphs.items():
            for who, fn in (("dx.run", (dx.run, y, None, client)),
                            ("dask.array", (ya.compute,))):
                cpu[f"{name} {who}"] = []
                fns[f"{name} {who}"] = _timed(cpu[f"{name} {who}"], *fn)
        timings = common.interleaved(fns, repeat, warmup=warmup)
        for key, times in cpu.items():  # the warm-ups are not timed
            timed = times[warmup:]
            timings[key]["process_cpu_median_s"] = float(np.median([p for p, _ in timed]))
            timings[key]["caller_cpu_median_s"] = float(np.median([t for _, t in timed]))
        tasks = {name: dx.compile(y, client=client).stats().tasks
                 for name, (y, _) in graphs.items()}
        # What the workers compute, apart from the driver: each task's compute time, summed
        # over one more run of each (the median of 3; one with --quick).
        work = {}
        for name, (y, ya) in graphs.items():
            for who, fn in (("dx.run", lambda y=y: dx.run(y, client=client)),
                            ("dask.array", ya.compute)):
                work[f"{name} {who}"] = float(np.median([_worker_seconds(client, fn)
                                                         for _ in range(1 if quick else 3)]))
    rows, ratios = [], {}
    for name in graphs:
        ours, theirs = timings[f"{name} dx.run"], timings[f"{name} dask.array"]
        ratios[name] = ours["median_s"] / theirs["median_s"]
        rows.append((name, str(tasks[name]), common.fmt(ours["median_s"] * 1e3, 1),
                     common.fmt(theirs["median_s"] * 1e3, 1), common.fmt(ratios[name]),
                     *(f"{common.fmt(ours[k] * 1e3, 1)} / {common.fmt(theirs[k] * 1e3, 1)}"
                       for k in ("process_cpu_median_s", "caller_cpu_median_s")),
                     f"{common.fmt(work[f'{name} dx.run'] * 1e3, 1)} / "
                     f"{common.fmt(work[f'{name} dask.array'] * 1e3, 1)}"))
    common.print_table(("graph", "dx tasks", "dx.run ms", "dask.array ms", "ratio",
                        "process CPU ms, dx / dask", "caller's CPU ms, dx / dask",
                        "workers' compute ms, dx / dask"), rows,
                       f"median of {repeat}, on one client, taking turns (process CPU: the "
                       f"driver and the scheduler, which runs in it)")
    res.update({"timings": timings, "tasks": tasks, "ratio_median": ratios,
                "worker_compute_s": work})
    res["targets"] = {
        name: common.target(f"{name}: dx.run within dask.array's compute() (median)",
                            ratios[name], ratios[name] <= 1.0) for name in graphs}
    common.write_results("bench_small_runs", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 timed runs of each, 1 warm-up")
    parser.add_argument("--repeat", type=int, help="timed runs of each (30; 3 with --quick)")
    args = parser.parse_args()
    main(args.quick, args.repeat)
