"""The cost of materializing an asset, and the speed of reading one back.

Why: `dx.materialize` adds to a run what makes it an asset: a task per Zarr chunk that
writes the chunk to storage as soon as it is computed, the checks, and the version rows.
Against `dx.run` of the same graph (which gathers the result into NumPy instead), that
should cost under 10% for a 4 GiB tensor written to local Zarr. Reading a stored asset
(`dx.load`, which compiles to `read_zarr` tasks) should be as fast as reading the same Zarr
array with dask.array directly.

What runs: a 2-worker LocalCluster (processes, 1 thread each); the asset is
`tanh(random.normal((rows, 1024)) * 0.5 + 0.1)` in float32 (4 GiB; 16 MiB with --quick).
Write side, taking turns, best and median of 3 after a warm-up each:
- `dx.run`: compute and gather into one NumPy array in this process;
- `dx.materialize`: compute, write to a fresh Zarr v3 version under a temp folder (local
  disk), record the version; the folder is deleted after each timed call, untimed;
- `dx.persist` + wait: compute only, chunks left on the workers (the floor both share).
Read side, on one stored version: the column sums of the stored array (reads every chunk,
returns 4 KiB) through `dx.load` and through `dask.array.from_zarr`, on the same cluster.

Run: `python benchmarks/bench_assets.py [--quick]` (--quick, a smoke test: 16 MiB, one timed
run of each and no warm-up).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import numpy as np

import common
import deepx_flow as dx

WIDTH = 1024


def _definitions(rows: int):
    @dx.asset
    def big():
        x = dx.random.normal((rows, WIDTH), seed=0, dtype="float32")
        return dx.tanh(x * 0.5 + 0.1)
    return dx.Definitions(assets=[big])


def main(quick: bool = False, repeat: int | None = None) -> dict:
    import dask.array as da

    repeat = repeat or (1 if quick else 3)
    warmup = 0 if quick else 1
    rows = 2**12 if quick else 2**20
    nbytes = rows * WIDTH * 4
    tmp = tempfile.mkdtemp(prefix="deepx-bench-assets-")
    os.environ["DEEPX_DB_URL"] = f"sqlite:///{tmp}/deepx.db"
    root = os.path.join(tmp, "assets")
    os.environ["DEEPX_ASSET_ROOT"] = root
    defs = _definitions(rows)
    y = defs["big"].fn()
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"shape": [rows, WIDTH], "dtype": "float32", "bytes": nbytes,
                          "repeat": repeat, "warmup": warmup, "workers": 2,
                          "threads_per_worker": 1, "storage": f"Zarr v3 on local disk ({tmp})"}}
    try:
        with common.local_cluster(2) as client:
            def run():
                out = dx.run(y, client=client)
                assert out.shape == (rows, WIDTH)

            def materialize():
                done = dx.materialize(defs, "big", client=client)
                uri = done.versions["big"].uri
                return lambda: shutil.rmtree(uri)

            def persist():
                handle = dx.persist(y, client=client).wait()
                return handle.release

            write = common.interleaved({"dx.run (gather to NumPy)": run,
                                        "dx.materialize (to local Zarr)": materialize,
                                        "dx.persist + wait (compute only)": persist}, repeat,
                                       warmup)
            stored = dx.materialize(defs, "big", client=client).versions["big"]
            chunks = tuple(int(c) for c in stored.chunks.strip("[]").split(","))
            sums = {}

            def read_dx():
                sums["dx"] = dx.run(dx.load("big").sum(axis=0), client=client)

            def read_dask():
                arr = da.from_zarr(stored.uri)
                sums["dask"] = arr.sum(axis=0, dtype="float32").compute()

            read = common.interleaved({"dx.load(...).sum(axis=0)": read_dx,
                                       "dask.array.from_zarr(...).sum(axis=0)": read_dask},
                                      repeat, warmup)
            np.testing.assert_allclose(sums["dx"], sums["dask"], rtol=1e-4)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gib = nbytes / 2**30
    run_s = write["dx.run (gather to NumPy)"]
    mat_s = write["dx.materialize (to local Zarr)"]
    floor = write["dx.persist + wait (compute only)"]
    overhead = mat_s["median_s"] / run_s["median_s"] - 1
    common.print_table(
        ("write side", "best s", "median s", "GiB/s", "vs dx.run"),
        [(name, common.fmt(t["best_s"], 2), common.fmt(t["median_s"], 2),
          common.fmt(gib / t["median_s"], 2), f"{t['median_s'] / run_s['median_s'] - 1:+.1%}")
         for name, t in write.items()],
        f"{rows} x {WIDTH} float32 ({gib:.2f} GiB), best and median of {repeat}")
    dx_read, dask_read = read["dx.load(...).sum(axis=0)"], \
        read["dask.array.from_zarr(...).sum(axis=0)"]
    ratio = dask_read["median_s"] / dx_read["median_s"]
    common.print_table(
        ("read side", "best s", "median s", "GiB/s"),
        [(name, common.fmt(t["best_s"], 2), common.fmt(t["median_s"], 2),
          common.fmt(gib / t["median_s"], 2)) for name, t in read.items()],
        f"reading the stored version (Zarr chunks {chunks})")
    res.update({"write": write, "read": read, "zarr_chunks": chunks,
                "materialize_overhead_vs_run": overhead,
                "materialize_over_compute_only": mat_s["median_s"] / floor["median_s"] - 1,
                "read_speed_vs_dask": ratio})
    res["targets"] = {
        "materialize_overhead": common.target(
            "materialize within 10% of dx.run (median)", overhead, overhead < 0.10),
        "read_vs_dask": common.target(
            "dx.load read at least as fast as dask.array.from_zarr (median, 5% noise)",
            ratio, ratio > 0.95)}
    common.write_results("bench_assets", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="16 MiB instead of 4 GiB, no warm-up run")
    parser.add_argument("--repeat", type=int, help="timed runs of each (3; 1 with --quick)")
    args = parser.parse_args()
    main(args.quick, args.repeat)
