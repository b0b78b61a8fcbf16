"""Chunked 8192 x 8192 float64 matmul on the local cluster vs NumPy's own BLAS.

Why: a matmul is compute-bound, so a chunked plan should reach the speed of one BLAS call on
the same cores, minus what it spends moving tiles between workers. The target is at least
0.8x NumPy; the compute/communication ratio (d) shows how much of the run is data movement.

What runs:
- NumPy: `a @ b` in this process (its BLAS uses every core; the thread count is reported);
- deepx_flow on a LocalCluster (2 worker processes x 1 thread, so the same 2 cores; each
  worker's BLAS runs 1 thread): the inputs are `dx.random.normal` persisted on the cluster;
  timed is `dx.persist(a @ b, inputs=...).wait()`.
Best of 3 after a warm-up, the two taking turns; the product is released between repeats.
GFLOP/s counts 2 n^3 floating-point operations.
(d) compute/communication: estimated by `dx.compile(...).stats()`, measured from the task
stream of the fastest timed run (compute seconds / transfer seconds). Target > 10.

Run: `python benchmarks/bench_matmul.py [--quick]` (--quick: 1024 x 1024, for smoke tests).
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np

import common
import deepx_flow as dx
from deepx_flow.runtime.inputs import bind_inputs


def main(quick: bool = False, repeat: int = 3) -> dict:
    n = 1024 if quick else 8192
    flop = 2.0 * n ** 3
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"n": n, "dtype": "float64", "repeat": repeat, "warmup": 1,
                          "workers": 2, "threads_per_worker": 1}}

    rng = np.random.default_rng(0)
    operands = [rng.standard_normal((n, n)), rng.standard_normal((n, n))]
    res["numpy_blas"] = common.blas_info()

    with common.local_cluster(2) as client:
        res["worker_blas"] = list(client.run(common.blas_info).values())
        a = dx.persist(dx.random.normal((n, n), seed=1, dtype="float64"), client=client).wait()
        b = dx.persist(dx.random.normal((n, n), seed=2, dtype="float64"), client=client).wait()
        inputs = {"a": a, "b": b}
        y = dx.input("a", (n, n), "float64") @ dx.input("b", (n, n), "float64")
        plan = dx.compile(y, client=client)
        stats = plan.stats()
        lowered_tasks = len(plan.lower(bind_inputs(plan.graph, inputs)).dsk)

        def run():
            return dx.persist(y, inputs=inputs, client=client).wait()

        def run_numpy():
            np.matmul(*operands)  # the product is dropped at once

        comms = []
        timings = common.interleaved(
            {"deepx_flow": lambda: run().release, "numpy": run_numpy}, repeat,
            around=lambda name: common.comm_stream(client, comms) if name == "deepx_flow"
            else contextlib.nullcontext())
        t_dx, t_np = timings["deepx_flow"], timings["numpy"]
        comm = comms[t_dx["times_s"].index(t_dx["best_s"])]
        comm["all_runs"] = [c["compute_comm_ratio"] for c in comms]
        comm["all_runs_not_overlapped"] = [c["compute_exposed_comm_ratio"] for c in comms]
        operands.clear()
        out = run()
        # Check the first 256 rows against NumPy.
        got = out.to_numpy()[:256]
        np.testing.assert_allclose(got, a.to_numpy()[:256] @ b.to_numpy(), rtol=1e-9,
                                   atol=1e-9 * n)
        out.release()
    out_id = plan.graph.outputs[0][1]
    res["deepx_flow"] = {**t_dx, "chunks": plan.chunks[out_id],
                         "k_chunks": plan.partition.k_chunks[out_id],
                         "tasks_lowered": lowered_tasks, "tasks_plan_stats": stats.tasks}
    res["numpy"] = t_np
    rows = []
    blas_threads = res["numpy_blas"].get("threads")
    for label, t in (("deepx_flow, 2 workers x 1 thread", t_dx),
                     (f"NumPy a @ b, {blas_threads or '?'} BLAS threads", t_np)):
        t["gflops"] = flop / t["best_s"] / 1e9
        t["vs_numpy"] = t_np["best_s"] / t["best_s"]
        rows.append((label, common.fmt(t["best_s"], 2), common.fmt(t["gflops"], 1),
                     common.fmt(t["vs_numpy"])))
    common.print_table(("", "seconds", "GFLOP/s", "vs NumPy"), rows,
                       f"{n} x {n} float64 matmul, best of {repeat}")
    res["compute_comm"] = common.compute_comm_report(stats, comm)
    ratio, est, meas = t_dx["vs_numpy"], stats.compute_comm_ratio, comm["compute_comm_ratio"]
    res["targets"] = {
        "vs_numpy": common.target("speed vs NumPy >= 0.8", ratio, ratio >= 0.8),
        "compute_comm_estimated": common.target("estimated compute/comm > 10", est, est > 10),
        "compute_comm_measured": common.target("measured compute/comm > 10", meas, meas > 10),
        # Context, not the target: transfer time that overlapped no compute on its worker.
        "compute_comm_measured_not_overlapped": common.target(
            "measured compute/comm, transfers not overlapped with compute > 10",
            comm["compute_exposed_comm_ratio"], comm["compute_exposed_comm_ratio"] > 10),
    }
    common.write_results("bench_matmul", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1024 x 1024 instead of 8192")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (best of)")
    args = parser.parse_args()
    main(args.quick, args.repeat)
