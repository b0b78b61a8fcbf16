"""What losing a worker costs a run, and recomputing vs reading back a stored chunk.

Why: the design promises that a run survives the loss of a worker at the least cost. Dask
recomputes what the dead worker held from the graph; the target is that a run which loses
one of four workers halfway finishes in under 1.5x the time of an undisturbed run. For
chunks of materialized assets the other way back is reading them from storage: the second
table measures both ways for one stored asset, per chunk, beside what the cost model
predicts for recomputing it (the figure a read-back-or-recompute decision would use).

What runs: a 4-worker LocalCluster (processes, 1 thread each). The run is
`tanh(normal((rows, 512)) @ uniform((512, 256))) * 2 + 1` summed over rows, float64, a few
hundred tasks. Taking turns, median of `repeat` after a warm-up: the undisturbed run, and the
same run with one worker SIGKILLed when half the undisturbed time has passed since its first
task started (its nanny starts a replacement, which the next turn waits for). Then the
matmul's result is materialized as an asset, and one chunk's worth is timed both ways:
computing the asset again (divided by its chunk count) and reading every stored chunk back
with `dx.load` (likewise).

Last, the read-back path itself, in a materialization on 3 workers x 2 threads: asset
`a = normal((8192, 2048)) @ normal((2048, 128))` and asset `b` reading it, where one task
of `b` hangs on each worker so the chunks of `a` it needs stay in memory after they were
written. The worker holding one of them is SIGKILLed, and the time until that chunk is in
memory again is taken from the scheduler's transition log: with `read_back` (the default)
and without (Dask computes its lineage again).

Run: `python benchmarks/bench_recovery.py [--quick]`. --quick (a smoke test of every part):
8,192 rows on 2 workers (one of them SIGKILLed), asset `a` of 4,096 rows in the read-back
part, one timed run of each and no warm-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time

import numpy as np
from distributed import Client, LocalCluster

import common
import deepx_flow as dx
from deepx_flow.kernels.faults import Fault, FaultInjection

WIDTH, OUT = 512, 256


def graph(rows: int):
    x = dx.random.normal((rows, WIDTH), seed=11, dtype="float64")
    w = dx.random.uniform((WIDTH, OUT), seed=12, dtype="float64") - 0.5
    return dx.tanh(x @ w)


def _pid():
    return os.getpid()


def _started(dask_scheduler) -> int:
    return sum(1 for ts in dask_scheduler.tasks.values() if ts.state in ("memory",
                                                                         "processing"))


def _kill_after_start(client, pid: int, delay: float) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and client.run_on_scheduler(_started) == 0:
        time.sleep(0.005)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)


def _wait_for_workers(client, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) < n and time.monotonic() < deadline:
        time.sleep(0.2)


INNER, COLS = 2048, 128  # the read-back scenario's asset: 1 MiB chunks, 16 MiB lineage


def _matmul_chunks(dask_scheduler=None):
    """(key, state, holders, needed by a waiting task) of the matmul's chunks, and whether
    every write of asset `a` finished."""
    chunks, writes = [], []
    for key, ts in dask_scheduler.tasks.items():
        if isinstance(key, tuple) and key[0].startswith("matmul"):
            chunks.append((key, ts.state, [w.address for w in ts.who_has or ()],
                           bool(ts.waiters)))
        elif isinstance(key, tuple) and key[0].startswith("store-a-"):
            writes.append(ts.state == "memory")
    return chunks, bool(writes) and all(writes)


def _made_at(key, since: float, dask_scheduler=None):
    """When `key` first went to memory after `since` (None: not yet)."""
    times = [e[-1] for e in dask_scheduler.story(key) if e[2] == "memory" and e[-1] > since]
    return min(times) if times else None


def _lost_chunk_back_s(client, rows: int, read_back: bool) -> float:
    """Seconds from SIGKILLing the worker holding a written, still needed chunk of asset `a`
    until that chunk is in memory again (see the module docstring)."""
    @dx.asset
    def a():
        return dx.random.normal((rows, INNER), seed=1, dtype="float64") @ \
            dx.random.normal((INNER, COLS), seed=2, dtype="float64")

    @dx.asset
    def b(a):
        return dx.tanh(a).sum(axis=1)

    client.register_plugin(FaultInjection([Fault("hang", node="sum", times=1)]))
    run = threading.Thread(target=dx.materialize, args=(dx.Definitions([a, b]),),
                           kwargs={"client": client,
                                   # no backup of the hung task: it would take the chunks
                                   # it waits for elsewhere and finish, releasing them
                                   "recovery": dx.Recovery(read_back=read_back,
                                                           speculate=False)})
    run.start()
    try:
        deadline, back = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            chunks, written = client.run_on_scheduler(_matmul_chunks)
            needed = [c for c in chunks if written and c[1] == "memory" and c[3]
                      and len(c[2]) == 1]
            if needed:
                break
            time.sleep(0.02)
        if not needed:
            raise RuntimeError("no written chunk of asset a was held for a waiting task "
                               "within 120 s: the scenario did not set up")
        key, _, (victim,), _ = needed[0]
        pid = client.run(_pid, workers=[victim])[victim]
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        while back is None and time.monotonic() < deadline:
            time.sleep(0.02)
            back = client.run_on_scheduler(_made_at, key, killed)
    finally:
        for _ in range(5):  # a worker that just died can fail the broadcast once
            try:
                client.unregister_worker_plugin(FaultInjection.name)
                break
            except OSError:
                time.sleep(1.0)
        run.join(300)
    return back - killed


def main(quick: bool = False, repeat: int | None = None) -> dict:
    repeat = repeat or (1 if quick else 5)
    warmup = 0 if quick else 1
    workers = 2 if quick else 4
    rows = 2**13 if quick else 2**16
    back_rows = 4096 if quick else 8192  # the read-back scenario's asset a
    tmp = tempfile.mkdtemp(prefix="deepx-bench-recovery-")
    os.environ["DEEPX_DB_URL"] = f"sqlite:///{tmp}/deepx.db"
    os.environ["DEEPX_ASSET_ROOT"] = os.path.join(tmp, "assets")
    y = (graph(rows) * 2.0 + 1.0).sum(axis=1)
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"rows": rows, "width": WIDTH, "out": OUT, "dtype": "float64",
                          "repeat": repeat, "warmup": warmup, "workers": workers,
                          "threads_per_worker": 1, "read_back_rows": back_rows}}
    try:
        # Killed workers make Dask log errors by design: only critical ones are shown.
        with common.local_cluster(workers, logs=logging.CRITICAL) as client:
            plan = dx.compile(y, client=client)
            res["parameters"]["tasks"] = plan.stats().tasks
            reference = dx.run(y, client=client)
            undisturbed = common.best_of(lambda: dx.run(y, client=client), repeat, warmup)
            half = undisturbed["median_s"] / 2
            results, times = [], []
            for _ in range(repeat):
                _wait_for_workers(client, workers)
                victim = sorted(client.run(_pid).items())[0][1]
                killer = threading.Thread(target=_kill_after_start,
                                          args=(client, victim, half))
                killer.start()
                began = time.perf_counter()
                results.append(dx.run(y, client=client))
                times.append(time.perf_counter() - began)
                killer.join()
            for out in results:
                np.testing.assert_array_equal(out, reference)
            lost = {"best_s": min(times), "median_s": sorted(times)[len(times) // 2],
                    "times_s": times}
            _wait_for_workers(client, workers)

            @dx.asset
            def projected():
                return graph(rows)

            defs = dx.Definitions([projected])
            stored = dx.materialize(defs, client=client).versions["projected"]
            shape, chunk = json.loads(stored.shape), json.loads(stored.chunks)
            n_chunks = math.prod(math.ceil(s / c) for s, c in zip(shape, chunk))
            asset_plan = dx.compile(graph(rows), client=client)
            node = asset_plan.fused.outputs[0][1]
            chunks_computed = int(np.prod([len(c) for c in asset_plan.chunks[node]]))
            recompute = common.best_of(lambda: dx.run(graph(rows), client=client), repeat,
                                       warmup)
            reload = common.best_of(lambda: dx.run(dx.load("projected"), client=client),
                                    repeat, warmup)
            predicted = asset_plan.stats().compute_seconds
        # The read-back path: 3 workers x 2 threads (one hangs), small memory (8 chunks).
        with LocalCluster(n_workers=3, threads_per_worker=2, processes=True,
                          memory_limit="200MiB", dashboard_address=None,
                          silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
            back = {}
            for read_back in (True, False) * repeat:
                _wait_for_workers(client, 3)
                back.setdefault(read_back, []).append(
                    _lost_chunk_back_s(client, back_rows, read_back))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = lost["median_s"] / undisturbed["median_s"]
    common.print_table(
        ("run", "best s", "median s", "vs undisturbed"),
        [("undisturbed", common.fmt(undisturbed["best_s"]), common.fmt(undisturbed["median_s"]),
          "1.00x"),
         (f"1 of {workers} workers SIGKILLed halfway", common.fmt(lost["best_s"]),
          common.fmt(lost["median_s"]), f"{ratio:.2f}x")],
        f"{rows} x {WIDTH} @ {WIDTH} x {OUT}, float64, {res['parameters']['tasks']} tasks, "
        f"median of {repeat}")
    per_recompute = recompute["median_s"] / chunks_computed
    per_reload = reload["median_s"] / n_chunks
    common.print_table(
        ("a lost chunk of a stored asset", "s per chunk", "chunks"),
        [("recompute (measured)", common.fmt(per_recompute, 4), str(chunks_computed)),
         ("recompute (cost model)", common.fmt(predicted / chunks_computed, 4),
          str(chunks_computed)),
         ("read back from Zarr (measured)", common.fmt(per_reload, 4), str(n_chunks))],
        f"asset tanh(x @ w), {stored.nbytes / 2**20:.0f} MiB stored")
    back_read, back_again = (sorted(back[r])[len(back[r]) // 2] for r in (True, False))
    common.print_table(
        ("a lost chunk of a materializing asset", "median s", "times s"),
        [("read back (read_back=True)", common.fmt(back_read, 3),
          " ".join(common.fmt(t, 3) for t in back[True])),
         ("computed again (read_back=False)", common.fmt(back_again, 3),
          " ".join(common.fmt(t, 3) for t in back[False]))],
        f"from SIGKILL of its worker to the chunk in memory again; 1 MiB chunk of "
        f"normal(({back_rows}, {INNER})) @ normal(({INNER}, {COLS})), median of {repeat}")
    res.update({"undisturbed": undisturbed, "one_worker_lost": lost, "slowdown": ratio,
                "recompute": recompute, "reload": reload,
                "recompute_s_per_chunk": per_recompute, "reload_s_per_chunk": per_reload,
                "recompute_predicted_s_per_chunk": predicted / chunks_computed,
                "stored_bytes": stored.nbytes,
                "lost_chunk_back_s": {"read_back": back[True], "recompute": back[False],
                                      "read_back_median_s": back_read,
                                      "recompute_median_s": back_again}})
    res["targets"] = {
        "worker_loss": common.target(
            f"a run losing 1 of {workers} workers halfway takes under 1.5x an undisturbed one "
            "(median)",
            ratio, ratio < 1.5),
        "reload_vs_recompute": common.target(
            "reading a lost stored chunk back is cheaper than recomputing it (measured)",
            per_reload / per_recompute, per_reload < per_recompute),
        "read_back_path": common.target(
            "a lost chunk of a materializing asset is back sooner read back than computed "
            "again (median)", back_read / back_again, back_read < back_again)}
    common.write_results("bench_recovery", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run, one repeat")
    parser.add_argument("--repeat", type=int, help="timed runs of each (5; 1 with --quick)")
    args = parser.parse_args()
    main(args.quick, args.repeat)
