"""The cost of recording runs in the metadata database: a 10,000-task run with recording on
vs off, on the same local cluster, taking turns.

Why: every `dx.run` records its run, each task (worker, times, bytes) and where each chunk
went. The scheduler plugin only appends to a buffer, and the driver writes it in batches
every second, so the run should not slow down by more than 5%.

What runs: a 2-worker LocalCluster (processes, 1 thread each). The graph is
`sum(tanh(random.normal((9472, 256))) * 2 + 1, axis=1)` planned for a cluster description
with a tiny memory budget, so it becomes about 10,000 tasks of 16 x 256 elements (the number
is printed and recorded): the run time is then mostly Dask's per-task cost, which is what
recording adds to. Timed is `dx.run(...)` (results gathered).
Recording writes to a fresh SQLite file (the default backend). Best and median of 7, after a
warm-up each, "on" and "off" alternating.

Run: `python benchmarks/bench_recording.py [--quick]` (--quick: about 150 tasks, one run
each and no warm-up).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import common
import deepx_flow as dx
from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec

# Each worker process imports this script again (multiprocessing's spawn), so the metadata
# database's modules (SQLModel, SQLAlchemy: about a second each) are imported in main().

WIDTH = 256


def _graph(rows: int):
    x = dx.random.normal((rows, WIDTH), seed=0, dtype="float32")
    return (dx.tanh(x) * 2.0 + 1.0).sum(axis=1)


def main(quick: bool = False, repeat: int | None = None) -> dict:
    from deepx_flow.meta import open_db, queries
    from deepx_flow.runtime import recorder_plugin, recording
    repeat = repeat or (1 if quick else 7)
    warmup = 0 if quick else 1
    rows = 256 if quick else 9472
    # 16 KiB of worker memory: chunks of 16 x 256, so each task is tiny and the run time is
    # mostly Dask's per-task cost, the part recording adds to.
    spec = ClusterSpec("small-budget", tuple(WorkerSpec(f"w{i}", "localhost", 1, 2**14)
                                             for i in range(2)))
    y = _graph(rows)
    tmp = tempfile.mkdtemp(prefix="deepx-bench-recording-")
    url = f"sqlite:///{tmp}/deepx.db"
    os.environ["DEEPX_DB_URL"] = url
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"shape": [rows, WIDTH], "dtype": "float32", "repeat": repeat,
                          "warmup": warmup, "workers": 2, "threads_per_worker": 1,
                          "database": "sqlite (fresh file)"}}
    with common.local_cluster(2) as client:
        plan = dx.compile(y, cluster=spec)
        tasks = plan.stats().tasks

        def run(record: bool):
            def go():
                os.environ["DEEPX_RECORD"] = "1" if record else "0"
                dx.run(y, client=client, cluster=spec)
            return go

        driver_before = recording.seconds_spent
        timings = common.interleaved({"recording on": run(True), "recording off": run(False)},
                                     repeat, warmup)
        # The recording work itself, apart from run-to-run noise: the driver's draining and
        # writing, and the scheduler plugin's hook, over all recorded runs (warm-up included).
        driver_s = recording.seconds_spent - driver_before
        hook_s = client.run_on_scheduler(recorder_plugin.hook_seconds)
    os.environ.pop("DEEPX_RECORD", None)
    db = open_db(url)
    recorded = queries.list_runs(db, limit=100)
    task_rows = len(queries.run_tasks(db, recorded[0].id))
    on, off = timings["recording on"], timings["recording off"]
    overhead_best = on["best_s"] / off["best_s"] - 1
    overhead_median = on["median_s"] / off["median_s"] - 1
    common.print_table(
        ("", "best s", "median s", "vs off"),
        [("recording on", common.fmt(on["best_s"], 3), common.fmt(on["median_s"], 3),
          f"{overhead_best:+.1%} / {overhead_median:+.1%}"),
         ("recording off", common.fmt(off["best_s"], 3), common.fmt(off["median_s"], 3), "-")],
        f"{tasks} tasks ({rows} x {WIDTH} float32), best and median of {repeat}")
    runs_on = repeat + warmup
    on_total = sum(on["times_s"]) + warmup * on["best_s"]  # the warm-up is not timed; ~best
    work = {"driver_s_per_run": driver_s / runs_on, "scheduler_hook_s_per_run": hook_s / runs_on,
            "driver_fraction": driver_s / on_total, "scheduler_hook_fraction": hook_s / on_total}
    print(f"recorded: {len(recorded)} runs, {task_rows} task rows in the last one")
    print(f"recording work per run: driver {work['driver_s_per_run']:.3f} s "
          f"({work['driver_fraction']:.1%} of the run, in a background thread), scheduler "
          f"hook {work['scheduler_hook_s_per_run']:.3f} s ({work['scheduler_hook_fraction']:.1%})")
    res.update({"tasks": tasks, "recording_on": on, "recording_off": off,
                "runs_recorded": len(recorded), "task_rows_last_run": task_rows,
                "overhead_best": overhead_best, "overhead_median": overhead_median,
                "recording_work": work})
    res["targets"] = {
        "overhead": common.target("recording overhead < 5% (median)", overhead_median,
                                  overhead_median < 0.05),
        # Not subject to run-to-run noise: what recording itself costs, as a share of a run.
        "recording_work": common.target(
            "driver + scheduler recording work < 5% of run time",
            work["driver_fraction"] + work["scheduler_hook_fraction"],
            work["driver_fraction"] + work["scheduler_hook_fraction"] < 0.05)}
    common.write_results("bench_recording", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 150 tasks")
    parser.add_argument("--repeat", type=int, help="timed runs of each (7; 1 with --quick)")
    args = parser.parse_args()
    main(args.quick, args.repeat)
