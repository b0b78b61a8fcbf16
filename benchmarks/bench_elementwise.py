"""A 10-operation elementwise chain on 2 GiB of float32: deepx_flow vs dask.array vs NumPy.

Why: an elementwise chain is memory-bound, so its ceiling is the machine's memory bandwidth.
deepx_flow fuses the chain into one kernel per chunk (the data is read once and written once),
where dask.array runs NumPy once per operation and chunk (a full-size temporary per
operation). This shows how close each gets to the memory-copy bandwidth and whether deepx_flow
meets its target of at least 2x dask.array on the same cluster.

What runs, all on one LocalCluster (2 worker processes x 1 thread, no dashboard):
- deepx_flow: the input is `dx.random.uniform` persisted on the cluster; timed is
  `dx.persist(chain, inputs={"x": persisted}).wait()`;
- dask.array: the input is `default_rng().random(dtype=float32).persist()`; timed is
  `chain(x).persist()` and a wait, with dask's automatic chunks and with deepx_flow's chunks;
- NumPy in this process on a 2 GiB array (one core);
- the memory-copy bandwidth (np.copyto, bytes read + written per second, 1 and all cores).
Best of 3 after a warm-up; outputs are released between repeats. Effective bandwidth counts
the input read once and the output written once (2 x 2 GiB).

(d) compute/communication: estimated by `dx.compile(chain, client=client).stats()` and
measured from the task stream of the fastest timed deepx_flow run (compute seconds / transfer
seconds; "inf" when nothing moved between workers). Target > 10.

Run: `python benchmarks/bench_elementwise.py [--quick]` (--quick: 64 MiB, one timed run of
each and no warm-up, for smoke tests).
"""

from __future__ import annotations

import argparse
import contextlib
import os

import numpy as np

import common
import deepx_flow as dx

OPS = 10  # x*1.5, +0.5, t*t, -x, abs(x), +1.0, /, maximum, *0.5, +0.25


def chain(x, abs_, maximum):
    """The benchmark expression, written once for deepx_flow, dask.array and NumPy."""
    t = x * 1.5 + 0.5
    t = t * t - x
    t = t / (abs_(x) + 1.0)
    return maximum(t, -1.0) * 0.5 + 0.25


def main(quick: bool = False, repeat: int | None = None) -> dict:
    import dask.array as da
    from distributed import wait

    repeat = repeat or (1 if quick else 3)
    warmup = 0 if quick else 1
    shape = (2048, 8192) if quick else (32768, 16384)
    nbytes = shape[0] * shape[1] * 4
    moved = 2 * nbytes  # the input read once, the output written once
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"shape": shape, "dtype": "float32", "input_bytes": nbytes,
                          "operations": OPS, "repeat": repeat, "warmup": warmup,
                          "workers": 2, "threads_per_worker": 1, "order": "interleaved"}}

    # References in this process, before the cluster holds any memory.
    copy1 = common.copy_bandwidth(min(nbytes, common.GiB))
    copy_all = common.copy_bandwidth(min(nbytes, common.GiB), threads=os.cpu_count())
    x_np = [np.random.default_rng(0).random(shape, dtype="float32")]
    t_np = common.best_of(lambda: chain(x_np[0], np.abs, np.maximum), repeat, warmup)
    x_np.clear()

    with common.local_cluster(2) as client:
        x_dx = dx.persist(dx.random.uniform(shape, seed=0, dtype="float32"),
                          client=client).wait()
        x = dx.input("x", shape, "float32")
        y = chain(x, dx.abs, dx.maximum)
        plan = dx.compile(y, client=client)
        stats = plan.stats()
        dx_chunks = plan.chunks["x"]
        x_auto = da.random.default_rng(0).random(shape, dtype="float32").persist()
        x_same = da.random.default_rng(0).random(shape, dtype="float32",
                                                 chunks=dx_chunks).persist()
        wait([x_auto, x_same])

        def run_dx():
            return dx.persist(y, inputs={"x": x_dx}, client=client).wait()

        def run_da(xa):
            ya = chain(xa, da.abs, da.maximum).persist()
            wait(ya)
            return [ya].clear  # dropping the last reference releases the result

        contenders = {"deepx_flow": lambda: run_dx().release,
                      "dask_array_auto_chunks": lambda: run_da(x_auto),
                      "dask_array_deepx_chunks": lambda: run_da(x_same)}
        counters = {name: {} for name in contenders}
        comms = {name: [] for name in contenders}

        @contextlib.contextmanager
        def observe(name):
            with common.worker_counters(client, counters[name]), \
                    common.comm_stream(client, comms[name]):
                yield

        timings = common.interleaved(contenders, repeat, warmup, around=observe)
        t_dx = timings["deepx_flow"]
        comm = comms["deepx_flow"][t_dx["times_s"].index(t_dx["best_s"])]
        out = run_dx()
        # The first chunks of the input and the result both start at the origin (their grids
        # may differ): compare the corner they share.
        x_first = np.asarray(client.gather(x_dx.futures[0]))
        got_first = np.asarray(client.gather(out.futures[0]))
        corner = tuple(slice(0, min(64, a, b)) for a, b in zip(x_first.shape, got_first.shape))
        np.testing.assert_allclose(got_first[corner],
                                   chain(x_first[corner], np.abs, np.maximum), rtol=1e-6)
        chunk_counts = {"deepx_flow": [len(c) for c in dx_chunks],
                        "dask_array_auto_chunks": [len(c) for c in x_auto.chunks],
                        "dask_array_deepx_chunks": [len(c) for c in x_same.chunks]}

    for name, t in timings.items():
        t.update(chunks=chunk_counts[name], workers_cpu_per_run={
            k: v / repeat for k, v in counters[name].items()})
    res.update(timings)
    res["deepx_flow"]["fused_kernels"] = sum(n.op == "fused" for n in plan.fused.nodes)
    res["numpy_one_process"] = t_np
    res["copy_bandwidth_gbps"] = {"one_thread": copy1 / common.GB,
                                  "all_cores": copy_all / common.GB}

    t_da = timings["dask_array_auto_chunks"]
    rows = []
    for label, t in (("deepx_flow", timings["deepx_flow"]),
                     ("dask.array (auto chunks)", t_da),
                     ("dask.array (deepx chunks)", timings["dask_array_deepx_chunks"]),
                     ("NumPy, 1 process", t_np)):
        gbps = moved / t["best_s"] / common.GB
        t["effective_gbps"] = gbps
        t["fraction_of_copy_bw"] = gbps * common.GB / copy_all
        t["speedup_vs_dask_auto"] = t_da["best_s"] / t["best_s"]
        cpu = t.get("workers_cpu_per_run", {})
        rows.append((label, common.fmt(t["best_s"], 3), common.fmt(t.get("median_s"), 3),
                     common.fmt(gbps), common.fmt(t["fraction_of_copy_bw"]),
                     common.fmt(t["speedup_vs_dask_auto"]),
                     common.fmt(cpu.get("system_s"), 1) + " / " + common.fmt(cpu.get("user_s"), 1)
                     if cpu else "-"))
    rows.append(("memcpy (np.copyto, 1 thread)", "-", "-", common.fmt(copy1 / common.GB),
                 "-", "-", "-"))
    rows.append((f"memcpy (np.copyto, {os.cpu_count()} threads)", "-", "-",
                 common.fmt(copy_all / common.GB), "1.00", "-", "-"))
    common.print_table(("", "best s", "median s", "GB/s", "of copy bw", "vs dask.array",
                        "workers sys/user s"), rows,
                       f"{OPS}-op float32 chain on {nbytes / common.GiB:.2f} GiB "
                       f"{shape}, best of {repeat}")
    res["compute_comm"] = common.compute_comm_report(stats, comm)
    speedup = t_da["best_s"] / timings["deepx_flow"]["best_s"]
    est, meas = stats.compute_comm_ratio, comm["compute_comm_ratio"]
    res["targets"] = {
        "speedup_vs_dask_array": common.target("speedup vs dask.array >= 2", speedup,
                                               speedup >= 2),
        "compute_comm_estimated": common.target("estimated compute/comm > 10", est, est > 10),
        "compute_comm_measured": common.target("measured compute/comm > 10", meas, meas > 10),
    }
    common.write_results("bench_elementwise", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB instead of 2 GiB")
    parser.add_argument("--repeat", type=int,
                        help="timed runs of each (best of; 3, 1 with --quick)")
    args = parser.parse_args()
    main(args.quick, args.repeat)
