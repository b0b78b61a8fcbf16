"""Training with parameters in pieces against replicated training, where both fit (issue 35).

What: an MLP (float32, widths 1024-2048-2048-10, tanh, softmax cross-entropy, Adam)
trained on 65,536 rows read from a Zarr store, batch 4,096 (16 MiB: the replicated loop
cuts it in one chunk per worker, so it is data parallel), 16 steps, on a LocalCluster of
4 worker processes x 1 thread, three times: `placement="replicated"`, `"tensor_parallel"`
and `"sharded"` (`train/pieces.py`). The same steps each time; the final parameters must
agree within float32 rounding.

Measured per placement:
- seconds per step after the first graph of steps came back (the history's times: the
  steps alone, without planning and the first reads);
- the bytes the workers received from each other during the training (their
  `transfer_incoming_log`), per step;
- the placement pass's prediction for this cluster (`dx.train(..., plan_only=True)`): its
  step seconds (the arithmetic at the workers' registered rate plus the collectives on the
  measured links) and the bytes its collectives send per step, all workers together.

Targets: a step in pieces at least 0.8x the replicated step's speed; the bytes moved at most
1.2x what the chosen strategy's collectives need; each step time within 25% of the
prediction.

Run: `python benchmarks/bench_sharded.py [--quick]` (--quick: widths 256-512-512-10, 16
steps; a smoke test).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import common
import deepx_flow as dx

PLACEMENTS = ("replicated", "tensor_parallel", "sharded")


def _model(widths):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [dx.nn.Linear(a, b), dx.nn.tanh]
    return dx.nn.Sequential(*layers[:-1])


def _start(widths, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        out[f"{2 * i}.weight"] = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        out[f"{2 * i}.bias"] = np.zeros(b, np.float32)
    return out


def _store(folder: Path, rows: int, widths) -> tuple[str, str]:
    import zarr
    rng = np.random.default_rng(1)
    x = zarr.open_array(str(folder / "x.zarr"), mode="w", shape=(rows, widths[0]),
                        chunks=(1024, widths[0]), dtype="float32")
    x[:] = rng.standard_normal((rows, widths[0]), dtype=np.float32)
    y = zarr.open_array(str(folder / "y.zarr"), mode="w", shape=(rows,), chunks=(1024,),
                        dtype="int64")
    y[:] = rng.integers(0, widths[-1], rows)
    return str(folder / "x.zarr"), str(folder / "y.zarr")


def run(placement, widths, data, batch, steps, client) -> dict:
    model = _model(widths)

    def loss(p, a, b):
        return dx.nn.cross_entropy(model(p, a), b)

    start = _start(widths)
    planned = dx.train(loss, start, data, batch, plan_only=True, client=client,
                       placement=placement, progress=False)
    measured: list = []
    began = time.perf_counter()
    with common.comm_stream(client, measured):
        fit = dx.train(loss, start, data, batch, epochs=1, optimizer=dx.optim.Adam(1e-3),
                       steps_per_graph=8, client=client, placement=placement,
                       progress=False)
    total = time.perf_counter() - began
    # the steps after the first graph's came back (each step's "seconds" is when its
    # graph's results did)
    first = fit.history[0]["seconds"]
    later = [h for h in fit.history if h["seconds"] > first]
    per_step = (later[-1]["seconds"] - first) / len(later) if later else total / fit.steps
    placed = planned.placement
    workers = placed.workers
    return {"placement": placement, "strategies": dict(fit.placement),
            "chosen": placed.strategies(), "steps": fit.steps, "total_s": total,
            "step_s": per_step, "predicted_step_s": placed.step_seconds,
            "predicted_compute_s": placed.compute_seconds,
            "predicted_comm_s": placed.communication_seconds,
            "collective_bytes_per_step": sum(p.sent for p in placed.placed) * workers,
            "moved_bytes_per_step": measured[0]["transfer_bytes"] / max(fit.steps, 1),
            "tasks": measured[0]["tasks"], "values": fit.values}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    machine = common.machine_info()
    widths, steps, batch = ([256, 512, 512, 10], 16, 256) if args.quick else \
        ([1024, 2048, 2048, 10], 16, 4096)
    results = []
    with tempfile.TemporaryDirectory() as tmp, common.local_cluster(4) as client:
        data = _store(Path(tmp), batch * steps, widths)
        for placement in PLACEMENTS:
            results.append(run(placement, widths, data, batch, steps, client))
    base = results[0]
    for r in results[1:]:  # the same steps: the same parameters, within float32 rounding
        for name, value in base["values"].items():
            err = np.linalg.norm(r["values"][name] - value) / np.linalg.norm(value)
            assert err < 1e-4, (r["placement"], name, err)
    rows = [(r["placement"], _counts(r["strategies"]),
             f"{r['step_s']:.3f}", f"{base['step_s'] / r['step_s']:.2f}x",
             f"{r['predicted_step_s']:.3f}", f"{r['moved_bytes_per_step'] / 2**20:.1f}",
             f"{r['collective_bytes_per_step'] / 2**20:.1f}", r["tasks"]) for r in results]
    common.print_table(("placement", "parameters", "step s", "speed vs replicated",
                        "predicted s", "moved MiB/step", "collectives MiB/step", "tasks"),
                       rows, f"MLP {'-'.join(map(str, widths))} float32, batch {batch}, "
                             f"{steps} steps, 4 workers x 1 thread")
    targets = []
    for r in results:
        if r["placement"] != "replicated":
            speed = base["step_s"] / r["step_s"]
            targets.append(common.target(f"{r['placement']} step at least 0.8x replicated's "
                                         "speed", speed, speed >= 0.8))
        ratio = r["moved_bytes_per_step"] / max(r["collective_bytes_per_step"], 1)
        targets.append(common.target(f"{r['placement']}: bytes moved at most 1.2x the "
                                     "collectives'", ratio, ratio <= 1.2))
        off = abs(r["step_s"] / r["predicted_step_s"] - 1)
        targets.append(common.target(f"{r['placement']}: step within 25% of the prediction",
                                     r["step_s"] / r["predicted_step_s"], off <= 0.25))
    for r in results:
        del r["values"]
    common.write_results("bench_sharded", {"machine": machine, "widths": widths,
                                           "batch": batch, "runs": results,
                                           "targets": targets}, args.quick)


def _counts(strategies: dict) -> str:
    counts: dict = {}
    for s in strategies.values():
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


if __name__ == "__main__":
    main()
