"""Plans for clusters we do not have: training steps of 1.5 and 7 billion parameter
transformers on 16, 64 and 256 H100s, beside published figures for such runs.

Why: issue 35 asks that a training step compile for a cluster file and say the strategy it
chose, the memory per GPU (under its limit), the predicted step time and the step's
compute/communication ratio, in float32 as the GPU kernels compute. Nothing is run: each
step is built (`dx.nn.TransformerLM`, Adam, next-token cross-entropy), its parameters are
placed and it is compiled (`train/step_plan.py`), for each cluster file
`graphs/clusters/{2,8,32}x8xH100.yaml` (8 GPUs a node, NVLink inside, InfiniBand between).
The micro-batch is the most sequences per GPU (of 8, 4, 2, 1) whose step fits.

The models: 1.5B is GPT-2 XL's shape (48 layers, width 1600, 25 heads, 1,024 positions);
7B is 32 layers of width 4096 with 32 heads and 2,048 positions (LLaMA-7B's size, GPT's
layers); both with GPT-2's vocabulary of 50,257 and tied embeddings.

Published: Megatron-LM's README (NVIDIA, 2024) reports, for GPT models trained on H100s in
bfloat16 with its tensor, pipeline and data parallelism and overlapped communication, a
model FLOPs utilization of 41% for its smallest model (about 2B parameters) rising to 47-48%
for the largest, and 47% falling to 42% when strong-scaling GPT-3 from 96 to 4,608 GPUs.
The table puts beside each plan the step time such a utilization would give at the GPUs'
float32 rate (the precision these plans compute in): the same fraction of a different peak.

Run: `python benchmarks/plan_scale.py [--quick]` (--quick: the 1.5B model on 16 GPUs only).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import common
import deepx_flow as dx
from deepx_flow.errors import PlanError
from deepx_flow.registry.cluster import load_cluster_file
from deepx_flow.train.step import build_step
from deepx_flow.train.step_plan import plan_step

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "1.5B": dict(vocab=50257, length=1024, dim=1600, heads=25, layers=48, block=512),
    "7B": dict(vocab=50257, length=1024, dim=4096, heads=32, layers=32, block=512),
}
CLUSTERS = ("2x8xH100", "8x8xH100", "32x8xH100")
PUBLISHED_MFU = (0.41, 0.48)  # Megatron-LM on H100, bfloat16 (see the docstring)


def plan_for(name: str, cluster_name: str) -> dict:
    cfg = MODELS[name]
    model = dx.nn.TransformerLM(**cfg)
    cluster = load_cluster_file(ROOT / "graphs" / "clusters" / f"{cluster_name}.yaml")
    gpus = len(cluster.workers)
    shapes = {k: (s, "float32") for k, s in model.shapes().items()}
    parameters = sum(math.prod(s) for s in model.shapes().values())
    for per_gpu in (8, 4, 2, 1):
        batch = [((per_gpu * gpus, cfg["length"]), "int64")] * 2
        began = time.perf_counter()
        step = build_step(model.loss, shapes, dx.optim.Adam(), batch)
        try:
            plan = plan_step(step.graph, step.params, step.state, cluster)
        except PlanError as err:
            last = str(err)
            continue
        placed = plan.placement
        rate = sum(w.compute_rate for w in cluster.workers)
        return {
            "model": name, "parameters": parameters, "cluster": cluster_name, "gpus": gpus,
            "sequences_per_gpu": per_gpu, "tokens_per_step": per_gpu * gpus * cfg["length"],
            "strategies": placed.strategies(),
            "kept_bytes": placed.kept, "live_bytes": plan.activations,
            "task_bytes": plan.task_memory, "memory_per_gpu": plan.memory_per_worker,
            "gpu_memory": min(w.budget for w in cluster.workers),
            "flops": placed.flops, "compute_s": placed.compute_seconds,
            "communication_s": placed.communication_seconds, "step_s": placed.step_seconds,
            "ratio": placed.ratio, "predicted_mfu": placed.flops / (placed.step_seconds * rate),
            "at_published_mfu_s": [placed.flops / (rate * m) for m in PUBLISHED_MFU],
            "planned_in_s": time.perf_counter() - began,
        }
    raise PlanError(f"{name} on {cluster_name}: no micro-batch fits: {last}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs = [("1.5B", "2x8xH100")] if args.quick else \
        [(m, c) for m in MODELS for c in CLUSTERS]
    rows, results = [], []
    for name, cluster in runs:
        r = plan_for(name, cluster)
        results.append(r)
        gib = 2**30
        rows.append((
            r["model"], r["gpus"], r["sequences_per_gpu"], f"{r['tokens_per_step']:,}",
            ", ".join(f"{n} {k}" for k, n in sorted(r["strategies"].items())),
            f"{r['memory_per_gpu'] / gib:.1f} / {r['gpu_memory'] / gib:.0f}",
            f"{r['step_s']:.3f}", f"{r['compute_s'] / r['step_s']:.0%}",
            common.fmt(r["ratio"]), f"{r['predicted_mfu']:.0%}",
            " - ".join(f"{s:.2f}" for s in reversed(r["at_published_mfu_s"]))))
    common.print_table(
        ("model", "GPUs", "seq/GPU", "tokens/step", "placement", "GiB/GPU", "step s",
         "compute", "comp/comm", "MFU", "at 41-48% MFU, s"), rows,
        "training steps planned in float32 (predicted; nothing run)")
    targets = [common.target(f"{r['model']} on {r['gpus']} GPUs fits in memory",
                             r["memory_per_gpu"] / r["gpu_memory"],
                             r["memory_per_gpu"] <= r["gpu_memory"]) for r in results]
    common.write_results("plan_scale", {"plans": results, "published_mfu": PUBLISHED_MFU,
                                        "targets": targets}, args.quick)


if __name__ == "__main__":
    main()
