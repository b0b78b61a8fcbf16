"""Training throughput of an MLP against JAX and a NumPy loop, its loss curve, and training on
a dataset three times a worker's memory.

What: the MLP 784-256-10 (ReLU, softmax cross-entropy, Adam lr 1e-3) trained on a float32
dataset read from Zarr (chunks of 8,192 rows), at batch 1,024 and 8,192:

- deepx_flow: `dx.train` on a LocalCluster of 2 worker processes x 1 thread, reading the Zarr
  arrays chunk by chunk on the workers; the time is the whole call (planning, the first
  parameters, every step, gathering the result). Also on 1 worker process x 2 threads (one
  worker per machine: the shards share the process's decoded blocks and send nothing), and
  that run's speed after its first graph of steps came back (the steps alone, without
  planning and the first reads of the stored blocks).
- JAX (when installed), twice, with the same model, initial parameters, Adam formulas and
  batches (the rows of `train.data`'s order for the same seed), one jitted step per batch, on
  the same cores:
  - the job: training from the same Zarr store, timed as `dx.train`'s whole call is: reading
    the arrays (once, whole: the dataset fits in memory), compiling the step at its first
    call, every step, the final parameters back; the fastest of three. The target compares
    with this one: the same work from the same stored data.
  - its steps alone: the data already in memory and the step compiled, untimed (the most
    favourable case for JAX). Set beside deepx_flow's speed after its first graph of steps.
- NumPy: the same step written with NumPy float32 arrays, on the data in memory.

JAX runs its own AVX-512 GEMM kernels; NumPy and deepx_flow's workers run NumPy's OpenBLAS,
whose kernels the environment may pin (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE). So the whole
comparison runs twice: with the environment as it is, then in a second process with those two
variables unset for that command only, where OpenBLAS picks the processor's own kernels; each
run records the kernels threadpoolctl reports in the driver and in a worker, and the table at
the end sets both side by side (`results/bench_training.json` and
`bench_training.native_blas.json`).

The loss curves must agree: the mean loss over the last tenth of the first epoch's steps,
deepx_flow against JAX (the same batches in the same order), within 2%. The step's
compute/communication ratio comes from Dask's task stream during the deepx_flow run (task
compute seconds over transfer seconds), against the design's bar of 10.

Larger than memory: the same model trained for one epoch at batch 8,192 on a dataset three
times a worker's memory limit (2 workers x 400 MiB), with the workers' resident memory sampled
during the run and their high-water marks read at the end.

Run: `python benchmarks/bench_training.py [--quick]` (--quick, a smoke test: 16,384 rows, one
epoch, batch 8,192 only, one JAX job, no wait for a quiet machine, and the big run on 1.5 times
a 256 MiB limit: writing and training on three times it took ~25 s on 2 busy cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common
import deepx_flow as dx

FEATURES, HIDDEN, CLASSES = 784, 256, 10
CHUNK_ROWS = 8192
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8


def write_dataset(folder: Path, rows: int, seed: int = 0) -> tuple[str, str]:
    """Features: class-dependent means plus noise, so the loss falls; labels 0..9."""
    import zarr
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32) * 0.5
    x = zarr.create_array(str(folder / "x.zarr"), shape=(rows, FEATURES),
                          chunks=(CHUNK_ROWS, FEATURES), dtype="float32")
    y = zarr.create_array(str(folder / "y.zarr"), shape=(rows,), chunks=(CHUNK_ROWS,),
                          dtype="int64")
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        labels = rng.integers(0, CLASSES, size=stop - start)
        x[start:stop] = centers[labels] + rng.standard_normal((stop - start, FEATURES),
                                                              dtype=np.float32)
        y[start:stop] = labels
    return str(folder / "x.zarr"), str(folder / "y.zarr")


def model():
    return dx.nn.Sequential(dx.nn.Linear(FEATURES, HIDDEN), dx.nn.relu,
                            dx.nn.Linear(HIDDEN, CLASSES))


def loss_fn(p, x, y):
    return dx.nn.cross_entropy(model()(p, x), y)


def batches(data, batch: int, epochs: int, seed: int, window_blocks: int):
    """The rows of every step, in deepx_flow's order for this seed."""
    from deepx_flow.train.data import batch_pieces, dataset_of, epoch_order
    ds = dataset_of(data)
    for epoch in range(epochs):
        windows = epoch_order(ds, seed, epoch, window_blocks)
        for pieces in batch_pieces(windows, batch):
            yield np.concatenate([windows[q.window][q.lo:q.hi] for q in pieces])


def run_deepx(data, start, batch, epochs, limit="auto", workers=2, threads=1) -> dict:
    with common.local_cluster(workers, memory_limit=limit, threads=threads) as client:
        streams: list = []
        with common.RssSampler(client) as rss, common.comm_stream(client, streams):
            began = time.perf_counter()
            fit = dx.train(loss_fn, start, data=data, batch_size=batch, epochs=epochs,
                           optimizer=dx.optim.Adam(lr=LR), seed=0, progress=False,
                           client=client)
            seconds = time.perf_counter() - began
        hwm = max(client.run(common.peak_rss).values())
        from deepx_flow.runtime.run import cluster_spec
        from deepx_flow.train.data import dataset_of, window_blocks_for
        spec = cluster_spec(client=client)
        blocks = window_blocks_for(dataset_of(data), min(w.memory for w in spec.workers))
    return {"seconds": seconds, "steps": fit.steps,
            "samples_per_second": fit.steps * batch / seconds,
            "steady_samples_per_second": _steady(fit.history, batch),
            "losses": [h["loss"] for h in fit.history], "stream": streams[0],
            "peak_rss": max(rss.peak, hwm), "window_blocks": blocks}


def _steady(history: list, batch: int) -> float | None:
    """Samples/s after the first graph of steps came back: the steps' own speed, without
    planning, the first reads of the stored blocks and the first graph's start."""
    first = history[0]["seconds"]
    later = [h for h in history if h["seconds"] > first]
    if not later:
        return None
    return len(later) * batch / (later[-1]["seconds"] - first)


def _jax_adam_step():
    """A fresh jitted Adam step of the MLP (a new function: it compiles at its first call)."""
    import jax
    import jax.numpy as jnp

    def loss(p, xb, yb):
        h = jax.nn.relu(xb @ p["0.weight"] + p["0.bias"])
        z = h @ p["2.weight"] + p["2.bias"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), yb[:, None], 1))

    @jax.jit
    def step(p, m, v, t, xb, yb):
        value, g = jax.value_and_grad(loss)(p, xb, yb)
        m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
        v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
        p = jax.tree.map(lambda p, m, v: p - LR / (1 - B1 ** t) * m /
                         (jnp.sqrt(v) / jnp.sqrt(1 - B2 ** t) + EPS), p, m, v)
        return p, m, v, value

    return step


def _jax_train(step, x, y, start, order):
    """Every step of `order` from `start`; the losses and the final parameters, waited for."""
    import jax
    import jax.numpy as jnp
    p = {k: jnp.asarray(v) for k, v in start.items()}
    m = jax.tree.map(jnp.zeros_like, p)
    v = jax.tree.map(jnp.zeros_like, p)
    losses = []
    for t, rows in enumerate(order, start=1):
        p, m, v, value = step(p, m, v, float(t), x[rows], y[rows])
        losses.append(value)
    return [float(v) for v in losses], {k: np.asarray(a) for k, a in p.items()}


def run_jax_job(data, start, order, repeat: int = 3) -> dict | None:
    """JAX training the same model from the same stored dataset, timed as `dx.train`'s whole
    call is: reading the Zarr arrays (the dataset fits in memory, so they are read once,
    whole, as `zarr_array[:]`), compiling the step at its first call, every step, and the
    final parameters back in NumPy arrays. The fastest of `repeat` jobs: the read's time
    varies several-fold between runs here (0.1 to 0.5 s), with the cost of the fresh memory
    it fills."""
    runs = [_jax_job(data, start, order) for _ in range(repeat)]
    return None if runs[0] is None else min(runs, key=lambda r: r["seconds"])


def _jax_job(data, start, order) -> dict | None:
    try:
        import jax
    except ImportError:
        return None
    import zarr
    jax.clear_caches()  # each job compiles its step, as a new process would
    began = time.perf_counter()
    x = zarr.open_array(data[0], mode="r")[:]
    y = zarr.open_array(data[1], mode="r")[:]
    read = time.perf_counter() - began
    losses, _ = _jax_train(_jax_adam_step(), x, y, start, order)
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "read_seconds": read, "steps": len(order),
            "samples_per_second": len(order) * len(order[0]) / seconds, "losses": losses,
            "version": jax.__version__}


def run_jax(x, y, start, order) -> dict | None:
    """JAX's steps alone: the data already in memory, the step compiled before timing."""
    try:
        import jax
    except ImportError:
        return None
    step = _jax_adam_step()
    _jax_train(step, x, y, start, order[:1])  # compile
    began = time.perf_counter()
    losses, _ = _jax_train(step, x, y, start, order)
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "steps": len(order),
            "samples_per_second": len(order) * len(order[0]) / seconds, "losses": losses,
            "version": jax.__version__}


def run_numpy(x, y, start, order) -> dict:
    p = {k: v.copy() for k, v in start.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    losses = []
    began = time.perf_counter()
    for t, rows in enumerate(order, start=1):
        xb, yb = x[rows], y[rows]
        h = np.maximum(xb @ p["0.weight"] + p["0.bias"], 0)
        z = h @ p["2.weight"] + p["2.bias"]
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        prob = e / e.sum(axis=1, keepdims=True)
        losses.append(float(-np.log(prob[np.arange(len(yb)), yb]).mean()))
        dz = prob
        dz[np.arange(len(yb)), yb] -= 1
        dz /= len(yb)
        dh = (dz @ p["2.weight"].T) * (h > 0)
        g = {"2.weight": h.T @ dz, "2.bias": dz.sum(0), "0.weight": xb.T @ dh,
             "0.bias": dh.sum(0)}
        for k in p:
            m[k] = B1 * m[k] + (1 - B1) * g[k]
            v[k] = B2 * v[k] + (1 - B2) * g[k] * g[k]
            p[k] = p[k] - LR / (1 - B1 ** t) * m[k] / (np.sqrt(v[k]) / np.sqrt(1 - B2 ** t)
                                                       + EPS)
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "steps": len(order),
            "samples_per_second": len(order) * len(order[0]) / seconds, "losses": losses}


def curve_gap(a: list, b: list, steps: int) -> float:
    """Relative difference of the mean loss over the last tenth of the first `steps`."""
    tail = max(1, steps // 10)
    x, y = np.mean(a[steps - tail:steps]), np.mean(b[steps - tail:steps])
    return abs(x - y) / abs(y)


# The variables that pin OpenBLAS's kernels; the second run unsets them.
BLAS_PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# The environment as this process was started. Starting a LocalCluster's nannies sets
# OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS to 1 (and MALLOC_TRIM_THRESHOLD_)
# in this process's own environment too: a second run started from it afterwards ran its
# NumPy loop and its driver's BLAS on one thread.
STARTING_ENVIRONMENT = dict(os.environ)


def main(quick: bool = False, blas: str = "both") -> dict:
    """`blas`: "environment" (the kernels the environment gives), "native" (this process
    was started with BLAS_PINS unset), or "both": the first here, then the second in a new
    process, and both summed up."""
    res = run_all(quick, blas)
    if blas == "both":
        env = {k: v for k, v in STARTING_ENVIRONMENT.items() if k not in BLAS_PINS}
        command = [sys.executable, __file__, "--blas", "native"] + (["--quick"] if quick else [])
        subprocess.run(command, env=env, check=True)
        name = "bench_training.native_blas" + (".quick" if quick else "")
        native = json.loads((common.RESULTS / f"{name}.json").read_text())
        rows = []
        for label, run in (("environment", res), ("processor's own", native)):
            at = run["throughput"]["8192"] if "8192" in run["throughput"] \
                else run["throughput"][8192]
            rows.append((label, ", ".join(f"{k}={run['blas_pins'].get(k)}" for k in BLAS_PINS),
                         str(run["blas"].get("kernels")), str(run["worker_blas"].get("kernels")),
                         common.fmt(max(at["deepx_flow"]["samples_per_second"],
                                        at["deepx_flow_1x2"]["samples_per_second"]), 0),
                         common.fmt(at["jax_job"]["samples_per_second"], 0)
                         if at["jax_job"] else "-",
                         common.fmt(at["numpy"]["samples_per_second"], 0),
                         common.fmt(at["deepx_vs_jax_job"]) if at["deepx_vs_jax_job"] else "-"))
        common.print_table(("OpenBLAS kernels", "pins", "driver", "worker", "deepx_flow",
                            "JAX job", "NumPy", "deepx/JAX job"), rows,
                           "batch 8,192, samples/s, with each choice of OpenBLAS kernels")
    return res


def run_all(quick: bool, blas: str) -> dict:
    import zarr
    rows = 16_384 if quick else 65_536
    epochs = 1 if quick else 2
    limit = (256 if quick else 400) * 2**20
    factor = 1.5 if quick else 3  # the big dataset's size over one worker's limit
    res = {"machine": common.machine_info(), "quick": quick,
           "parameters": {"rows": rows, "epochs": epochs, "model": [FEATURES, HIDDEN, CLASSES],
                          "optimizer": "Adam lr 1e-3", "chunk_rows": CHUNK_ROWS,
                          "workers": "2 processes x 1 thread", "big_limit": limit,
                          "big_dataset_over_limit": factor},
           "blas": common.blas_info(),
           "blas_pins": {k: os.environ.get(k) for k in BLAS_PINS},
           # --quick, a smoke test, does not wait (up to 15 minutes) for a quiet machine.
           "busy_before": None if quick else common.wait_until_quiet()}
    params = model().init(seed=0)
    with common.local_cluster(1) as client:
        start = dict(zip(params, dx.run(list(params.values()), client=client)))
        # the kernels the workers run: they inherit this process's environment
        res["worker_blas"] = next(iter(client.run(common.blas_info).values()))
    table, throughput = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        data = write_dataset(Path(tmp), rows)
        x = np.asarray(zarr.open_array(data[0], mode="r"))
        y = np.asarray(zarr.open_array(data[1], mode="r"))
        # --quick times batch 8,192 alone (the targets' batch): each size costs two cluster
        # start-ups; the big run below still makes more than one graph of steps.
        for batch in (8192,) if quick else (1024, 8192):
            deepx = run_deepx(data, start, batch, epochs)
            threaded = run_deepx(data, start, batch, epochs, workers=1, threads=2)
            order = list(batches(data, batch, epochs, 0, deepx["window_blocks"]))
            jax_job = run_jax_job(data, start, order, repeat=1 if quick else 3)
            jax_run = run_jax(x, y, start, order)
            numpy_run = run_numpy(x, y, start, order)
            per_epoch = rows // batch
            entry = {"deepx_flow": deepx, "deepx_flow_1x2": threaded, "jax_job": jax_job,
                     "jax": jax_run, "numpy": numpy_run, "steps_per_epoch": per_epoch}
            reference = jax_run or numpy_run
            entry["loss_gap_after_one_epoch"] = curve_gap(deepx["losses"],
                                                          reference["losses"], per_epoch)
            best = max(deepx["samples_per_second"], threaded["samples_per_second"])
            entry["deepx_vs_jax_job"] = best / jax_job["samples_per_second"] if jax_job \
                else None
            entry["deepx_steady_vs_jax_steps"] = (
                threaded["steady_samples_per_second"] / jax_run["samples_per_second"]
                if jax_run and threaded["steady_samples_per_second"] else None)
            entry["deepx_vs_numpy"] = best / numpy_run["samples_per_second"]
            stream = deepx["stream"]
            entry["compute_comm_ratio"] = stream["compute_comm_ratio"]
            throughput[batch] = entry
            table.append((f"{batch}", common.fmt(deepx["samples_per_second"], 0),
                          common.fmt(threaded["samples_per_second"], 0),
                          common.fmt(threaded["steady_samples_per_second"], 0)
                          if threaded["steady_samples_per_second"] else "-",
                          common.fmt(jax_job["samples_per_second"], 0) if jax_job else "-",
                          common.fmt(jax_run["samples_per_second"], 0) if jax_run else "-",
                          common.fmt(numpy_run["samples_per_second"], 0),
                          common.fmt(entry["deepx_vs_jax_job"]) if jax_job else "-",
                          common.fmt(entry["deepx_steady_vs_jax_steps"])
                          if entry["deepx_steady_vs_jax_steps"] else "-",
                          f"{entry['loss_gap_after_one_epoch']:.2%}",
                          common.fmt(stream["compute_comm_ratio"], 1)))
            for run in (deepx, threaded, jax_job, jax_run, numpy_run):
                if run:
                    run.pop("losses")
        res["throughput"] = throughput
        common.print_table(("batch", "deepx_flow, 2x1 (whole call)", "1x2 (whole call)",
                            "1x2 after its first graph", "JAX job from Zarr",
                            "JAX steps (data in memory)", "NumPy steps",
                            "deepx/JAX job", "deepx 1x2 after first graph / JAX steps",
                            "loss gap (1 epoch)", "compute/comm"), table,
                           f"MLP {FEATURES}-{HIDDEN}-{CLASSES}, Adam, {rows} rows from Zarr, "
                           "2 cores, samples/s; NumPy's BLAS: " + ", ".join(
                               f"{k} {v}" for k, v in res["blas"].items()))

        big_rows = int(factor * limit) // (FEATURES * 4 + 8)
        folder = Path(tmp) / "big"
        folder.mkdir()
        run = run_deepx(write_dataset(folder, big_rows, seed=1), start, 8192, 1, limit=limit)
        run.pop("losses")
        run["dataset_bytes"] = big_rows * (FEATURES * 4 + 8)
        run["peak_rss_fraction_of_limit"] = run["peak_rss"] / limit
        res["larger_than_memory"] = run
        common.print_table(("dataset MiB", "limit MiB", "peak RSS MiB", "of limit", "samples/s"),
                           [(f"{run['dataset_bytes'] / 2**20:.0f}", f"{limit / 2**20:.0f}",
                             f"{run['peak_rss'] / 2**20:.0f}",
                             common.fmt(run["peak_rss_fraction_of_limit"]),
                             common.fmt(run["samples_per_second"], 0))],
                           f"one epoch on a dataset {factor:g}x a worker's memory")

    at = throughput[8192]
    ratio = at["deepx_vs_jax_job"] or at["deepx_vs_numpy"]
    res["targets"] = {
        "deepx_vs_jax_at_8192": common.target(
            "samples/s at batch 8192, training from the stored dataset (the whole `dx.train` "
            "call, the better cluster), at least 0.7x JAX's training from the same store "
            "(reading it, compiling, every step); NumPy's loop when JAX is missing", ratio,
            ratio >= 0.7),
        "loss_curve_within_2pct": common.target(
            "mean loss over the last tenth of epoch 1 within 2% of JAX's at the same data order",
            max(e["loss_gap_after_one_epoch"] for e in throughput.values()),
            all(e["loss_gap_after_one_epoch"] <= 0.02 for e in throughput.values())),
        "larger_than_memory_below_limit": common.target(
            f"peak worker RSS / limit < 1 training on a dataset {factor:g}x the limit",
            res["larger_than_memory"]["peak_rss_fraction_of_limit"],
            0 < res["larger_than_memory"]["peak_rss_fraction_of_limit"] < 1),
        "compute_comm_ratio_recorded": common.target(
            "the step's compute/communication ratio, against the design's bar of 10",
            at["compute_comm_ratio"], at["compute_comm_ratio"] >= 10),
    }
    common.write_results("bench_training" + (".native_blas" if blas == "native" else ""), res,
                         quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="16,384 rows, one epoch, batch 8,192, 1.5 x 256 MiB for the big "
                        "run")
    parser.add_argument("--blas", choices=("both", "environment", "native"), default="both",
                        help="both (default): the environment's OpenBLAS kernels, then a "
                        "second process with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset")
    args = parser.parse_args()
    main(args.quick, args.blas)
