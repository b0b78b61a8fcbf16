"""Compile and lowering time for plans of about 10 thousand, 100 thousand and 1 million chunks.

Why: the compiler must keep up with graphs over very large tensors split into many chunks.
`compile_graph` (validate, infer, fuse, partition) works on axis classes, not on chunks, so it
should not grow with the chunk count; lowering (`Plan.lower`, one Dask task per chunk step)
grows linearly with it. Target: compile under 5 s for a plan of ~100,000 chunks.

The graph: a 65536 x 65536 float32 `dx.random.normal` tensor, a 5-operation elementwise chain
and a sum over axis 1 (the chain becomes the reduction's prologue, so each chunk is one random
task and one partial-sum task, plus the tree reduction). The chunk count is forced with a
two-worker ClusterSpec whose memory is chosen (a power of two) to give the chunk count closest
to each target; the counts are powers of two because the partitioner halves chunks. Nothing
runs: the graph has no inputs and is lowered with `plan.lower({})`.

Run: `python benchmarks/bench_compile.py [--quick] [--no-million]` (--quick: 1k and 10k
chunks, for smoke tests).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time

import psutil

# Plans of up to a million chunks are what this measures: more tasks than the default limit
# a run accepts (DEEPX_MAX_TASKS), which is about what a scheduler can hold, not the compiler.
os.environ.setdefault("DEEPX_MAX_TASKS", str(10**9))

import common
import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec, format_bytes

SHAPE = (65536, 65536)


def build():
    x = dx.random.normal(SHAPE, seed=0, dtype="float32")
    t = dx.tanh(x * 1.5 + 0.5) * x - 1.0
    return dx.build_graph(t.sum(axis=1))


def spec(memory: int) -> ClusterSpec:
    return ClusterSpec(f"bench-{memory}", tuple(
        WorkerSpec(f"w{i}", "localhost", 1, memory) for i in range(2)))


def source_chunks(plan) -> int:
    node = next(n for n in plan.fused.nodes if n.op == "random_normal")
    return math.prod(len(c) for c in plan.chunks[node.id])


def memory_for(graph, target: int) -> int:
    """The power-of-two worker memory whose plan has the source chunk count nearest `target`."""
    tried = {m: source_chunks(compile_graph(graph, spec(2**m))) for m in range(12, 38)}
    best = min(tried, key=lambda m: abs(math.log(tried[m] / target)))
    return 2**best


def measure(graph, target: int, repeat: int) -> dict:
    memory = memory_for(graph, target)
    cluster = spec(memory)
    t_compile = common.best_of(lambda: compile_graph(graph, cluster), repeat)
    plan = compile_graph(graph, cluster)
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    t_lower = common.best_of(lambda: plan.lower({}), repeat, warmup=0 if repeat == 1 else 1)
    lowered = plan.lower({})
    rss1 = psutil.Process().memory_info().rss
    tasks = len(lowered.dsk)
    del lowered
    gc.collect()
    chunks = sum(math.prod(len(c) for c in plan.chunks[n.id]) for n in plan.fused.nodes)
    chunks += sum(math.prod(len(c) for c in s) for s in plan.partition.spaces.values())
    return {"target_chunks": target, "worker_memory": memory,
            "task_budget": plan.partition.budget, "source_chunks": source_chunks(plan),
            "chunks_all_tensors": chunks, "tasks_lowered": tasks,
            "tasks_plan_stats": plan.stats().tasks, "compile": t_compile, "lower": t_lower,
            "lower_us_per_task": t_lower["best_s"] / tasks * 1e6,
            "lowered_graph_rss_bytes": max(0, rss1 - rss0)}


def main(quick: bool = False, million: bool = True, repeat: int = 3) -> dict:
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(),
           "parameters": {"shape": SHAPE, "dtype": "float32",
                          "graph": "random_normal -> tanh(x*1.5+0.5)*x-1.0 -> sum(axis=1)",
                          "workers": 2, "threads_per_worker": 1, "repeat": repeat}}
    graph = build()
    targets = [1_000, 10_000] if quick else [10_000, 100_000] + ([1_000_000] if million else [])
    runs = []
    for target in targets:
        start = time.perf_counter()
        runs.append(measure(graph, target, 1 if target >= 1_000_000 else repeat))
        runs[-1]["wall_s"] = time.perf_counter() - start
    res["runs"] = runs

    rows = [(f"{r['target_chunks']:,}", f"{r['source_chunks']:,}", f"{r['chunks_all_tensors']:,}",
             f"{r['tasks_lowered']:,}", format_bytes(r["task_budget"]),
             common.fmt(r["compile"]["best_s"] * 1e3, 1), common.fmt(r["lower"]["best_s"], 2),
             common.fmt(r["lower_us_per_task"], 1), format_bytes(r["lowered_graph_rss_bytes"]))
            for r in runs]
    common.print_table(("~chunks", "source chunks", "all chunks", "tasks", "task budget",
                        "compile ms", "lower s", "lower us/task", "graph RSS"), rows,
                       f"compile_graph and Plan.lower, {SHAPE} float32, best of {repeat}")
    near = min(runs, key=lambda r: abs(math.log(r["source_chunks"] / 100_000)))
    value = near["compile"]["best_s"]
    res["targets"] = {"compile_s_at_100k_chunks": common.target(
        f"compile s < 5 at {near['source_chunks']:,} chunks", value, value < 5,
        chunks=near["source_chunks"])}
    common.write_results("bench_compile", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k chunks only")
    parser.add_argument("--no-million", action="store_true", help="skip the 1M-chunk plan")
    args = parser.parse_args()
    main(args.quick, not args.no_million)
