"""`dx.cumsum` on a float32 Zarr array: deepx_flow vs dask.array vs NumPy, beside an
elementwise operation on the same array.

Why (issue 30, item 11): cumsum was a sum over a triangular mask, quadratic in the scanned
axis ((100, 8000) took 117 s where NumPy takes 0.015 s). It is now one scan operator: each
chunk's running sums plus the carry of the chunks before it (`ops/scan.py`), which should
cost about what an elementwise pass over the same data costs: a read, a write, and a second
read of the chunks whose totals feed a carry.

What runs, all on one LocalCluster (2 worker processes x 1 thread, no dashboard), on a
float32 array stored in Zarr (stored chunks of a quarter of the rows and an eighth of the
columns, so the scanned axis spans several stored chunks either way):
- for each axis: `dx.cumsum(dx.read_zarr(path), axis)` and `dx.read_zarr(path) * 2 + 1`,
  persisted and waited for (`dx.persist(...).wait()`), and the same two through
  `dask.array.from_zarr(path)` (`.persist()` and a wait), taking turns; outputs released
  between runs;
- NumPy in this process: `np.cumsum` and `x * 2 + 1` on the array in memory (no read);
- the issue's case, (100, 8000) float64 given as an array along axis 1: `dx.run` vs NumPy.
Best of 3 after a warm-up. Each deepx_flow result is checked against NumPy's cumsum in
float64 on its first and last chunk along the axis (the last carries every chunk's total).

Targets: deepx_flow's cumsum within 2x of its elementwise pass on the same array (median),
at least as fast as dask.array's cumsum, and the issue's case under 1 s.

Run: `python benchmarks/bench_scan.py [--quick]` (about 2 minutes; --quick: 16 MiB, seconds).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import common
import deepx_flow as dx


def write_array(path: Path, shape, chunks) -> np.ndarray:
    import zarr
    data = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    store = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float32")
    store[...] = data
    return data


def check(persisted, data: np.ndarray, axis: int) -> float:
    """The largest error of the first and last chunk along `axis` (in the first line of
    chunks) against NumPy's float64 cumsum, relative to the sum of |terms| there."""
    chunks = persisted.chunks
    counts = [len(c) for c in chunks]
    worst = 0.0
    for along in (0, counts[axis] - 1):
        idx = [0] * len(chunks)
        idx[axis] = along
        flat = int(np.ravel_multi_index(idx, counts))
        got = np.asarray(persisted.client.gather(persisted.futures[flat]))
        region = tuple(slice(sum(c[:i]), sum(c[:i + 1])) for c, i in zip(chunks, idx))
        line = tuple(slice(None) if a == axis else r for a, r in enumerate(region))
        wide = data[line].astype(np.float64)
        want = np.cumsum(wide, axis=axis)[tuple(
            r if a == axis else slice(None) for a, r in enumerate(region))]
        terms = np.cumsum(np.abs(wide), axis=axis)[tuple(
            r if a == axis else slice(None) for a, r in enumerate(region))]
        worst = max(worst, float(np.max(np.abs(got - want) / (terms + 1e-30))))
    return worst


def main(quick: bool = False, repeat: int = 3) -> dict:
    import dask.array as da
    from distributed import wait

    shape = (512, 8192) if quick else (4096, 32768)
    chunks = (shape[0] // 4, shape[1] // 8)
    nbytes = shape[0] * shape[1] * 4
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"shape": shape, "dtype": "float32", "stored_chunks": chunks,
                          "input_bytes": nbytes, "repeat": repeat, "warmup": 1,
                          "workers": 2, "threads_per_worker": 1, "order": "interleaved"}}
    rows, targets = [], {}
    with tempfile.TemporaryDirectory() as tmp, common.local_cluster(2) as client:
        path = Path(tmp) / "x.zarr"
        data = write_array(path, shape, chunks)
        numpy_s = {}
        for axis in (1, 0):
            numpy_s[axis] = common.best_of(lambda: np.cumsum(data, axis=axis), repeat)
        numpy_s["elementwise"] = common.best_of(lambda: data * 2 + 1, repeat)
        for axis in (1, 0):
            x = dx.read_zarr(str(path))
            scan, pointwise = dx.cumsum(x, axis=axis), x * 2.0 + 1.0
            xa = da.from_zarr(str(path))

            def run_dx(y):
                return dx.persist(y, client=client).wait().release

            def run_da(y):
                out = y.persist()
                wait(out)
                return [out].clear

            contenders = {"deepx_flow cumsum": lambda: run_dx(scan),
                          "deepx_flow x * 2 + 1": lambda: run_dx(pointwise),
                          "dask.array cumsum": lambda: run_da(xa.cumsum(axis=axis)),
                          "dask.array x * 2 + 1": lambda: run_da(xa * 2 + 1)}
            timings = common.interleaved(contenders, repeat)
            plan = dx.compile(scan, client=client)
            out = dx.persist(scan, client=client).wait()
            error = check(out, data, axis)
            out.release()
            grid = [len(c) for c in plan.chunks[scan.node.id]]
            tasks = next(r.tasks for r in plan.stats().nodes if r.node == scan.node.id)
            res[f"axis{axis}"] = {**timings, "chunks": grid, "cumsum_tasks": tasks,
                                  "relative_error": error, "numpy_cumsum": numpy_s[axis]}
            for name, t in timings.items():
                rows.append((f"axis {axis}: {name}", common.fmt(t["best_s"], 3),
                             common.fmt(t["median_s"], 3),
                             common.fmt(2 * nbytes / t["best_s"] / common.GB)))
            rows.append((f"axis {axis}: NumPy cumsum, 1 process", common.fmt(
                numpy_s[axis]["best_s"], 3), common.fmt(numpy_s[axis]["median_s"], 3), "-"))
            vs_pointwise = timings["deepx_flow cumsum"]["median_s"] / \
                timings["deepx_flow x * 2 + 1"]["median_s"]
            vs_dask = timings["dask.array cumsum"]["best_s"] / \
                timings["deepx_flow cumsum"]["best_s"]
            targets[f"axis{axis}_vs_elementwise"] = common.target(
                f"axis {axis}: cumsum / elementwise (median) <= 2", vs_pointwise,
                vs_pointwise <= 2)
            targets[f"axis{axis}_vs_dask"] = common.target(
                f"axis {axis}: speedup vs dask.array's cumsum >= 1", vs_dask, vs_dask >= 1)
            targets[f"axis{axis}_correct"] = common.target(
                f"axis {axis}: error / sum of |terms| < 1e-6", error, error < 1e-6)
        rows.append(("NumPy x * 2 + 1, 1 process", common.fmt(
            numpy_s["elementwise"]["best_s"], 3), common.fmt(
            numpy_s["elementwise"]["median_s"], 3), "-"))

        # The issue's case: (100, 8000) float64 along its long axis, given as an array.
        small = np.random.default_rng(1).standard_normal((100, 8000))
        t = dx.input("x", small.shape, "float64")
        y = dx.cumsum(t, axis=1)
        issue = common.best_of(lambda: dx.run(y, inputs={"x": small}, client=client,
                                              progress=False), repeat)
        issue_numpy = common.best_of(lambda: np.cumsum(small, axis=1), repeat)
        got = dx.run(y, inputs={"x": small}, client=client, progress=False)
        np.testing.assert_allclose(got, np.cumsum(small, axis=1), rtol=1e-12, atol=1e-9)
        res["issue_case"] = {"shape": small.shape, "deepx_flow_run": issue,
                             "numpy": issue_numpy, "before_fix_s": 117}
        rows.append(("(100, 8000) f64: dx.run (117 s before)", common.fmt(issue["best_s"], 3),
                     common.fmt(issue["median_s"], 3), "-"))
        rows.append(("(100, 8000) f64: NumPy", common.fmt(issue_numpy["best_s"], 4),
                     common.fmt(issue_numpy["median_s"], 4), "-"))
        targets["issue_case"] = common.target("(100, 8000) dx.run < 1 s", issue["best_s"],
                                              issue["best_s"] < 1)
    common.print_table(("", "best s", "median s", "GB/s read+written"), rows,
                       f"cumsum of float32 {shape} ({nbytes / common.GiB:.2f} GiB) from Zarr, "
                       f"best of {repeat}")
    res["targets"] = targets
    common.write_results("bench_scan", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB instead of 512 MiB")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (best of)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    main(args.quick, args.repeat)
    print(f"took {time.perf_counter() - t0:.0f} s")
