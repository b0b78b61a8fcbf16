"""Time for large graphs: long elementwise chains and wide concats, compiled, explained, run.

Why: a graph's size must cost linear time. Measured before issue 30 (item 9): a 20,000-node
chain took 102 s to `deepx-flow explain`, a 5,000-way concat over 90 s to run. Targets: a
20,000-node chain's `dx.compile(...).explain()` and `deepx-flow explain` of its spec under
5 s each; time per node (per operand) no larger at the largest size than at the smallest
times 2 (linear, allowing for noise).

The graphs:
- chain: `x` (1000 x 100 float64) through n alternating `* 1.0001` and `+ 0.5` nodes (they
  fuse into one kernel): built in Python, compiled (`compile_graph`, no plan cache) and
  explained; written as a spec (`dx.to_yaml`), read back (`dx.from_yaml`), and explained by
  `deepx-flow explain` in a new process (its imports included); run on a local cluster of two
  worker processes.
- concat of slices: `dx.concat([x[i:i+1] for i in range(n)])` of one (n x 8) input.
- concat of inputs: n separate (1 x 8) inputs concatenated.
Every run is checked against NumPy in float64. Each size is timed once (the sizes differ by
2x and 4x, which is the comparison that matters); the machine's load is recorded, and each
step's CPU seconds beside its wall seconds (on a shared machine they show the work when other
jobs stretch the wall clock).

Run: `python benchmarks/bench_graph_size.py [--quick]` (--quick: small sizes, for smoke tests).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common
import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.runtime.inputs import bind_inputs
from deepx_flow.runtime.run import cluster_spec

ROOT = Path(__file__).resolve().parents[1]


def timed(into: dict, step: str, fn):
    """`fn()`, with its wall seconds recorded as `<step>_s` in `into` and its CPU seconds
    (this process's and its children's: the machine is shared, and CPU time shows the work
    when other jobs slow the wall clock) as `<step>_cpu_s`."""
    wall, cpu = time.perf_counter(), sum(os.times()[:4])
    value = fn()
    into[f"{step}_s"] = time.perf_counter() - wall
    into[f"{step}_cpu_s"] = sum(os.times()[:4]) - cpu
    return value


def chain(n: int):
    x = dx.input("x", (1000, 100), "float64")
    y = x
    for i in range(n):
        y = y * 1.0001 if i % 2 else y + 0.5
    return y


def chain_reference(x: np.ndarray, n: int) -> np.ndarray:
    for i in range(n):
        x = x * 1.0001 if i % 2 else x + 0.5
    return x


def compile_and_explain(res: dict, y, inputs: dict) -> None:
    graph = timed(res, "build_graph", lambda: dx.build_graph(y))
    plan = timed(res, "compile", lambda: compile_graph(graph, cluster_spec(None)))
    text = timed(res, "explain", plan.explain)
    lowered = timed(res, "lower", lambda: plan.lower(bind_inputs(plan.graph, inputs)))
    res.update(nodes=len(graph.nodes), tasks_lowered=len(lowered.dsk),
               tasks_plan_stats=plan.stats().tasks, explain_lines=len(text.splitlines()))


def run_checked(res: dict, client, y, inputs: dict, expected: np.ndarray) -> None:
    try:
        out = timed(res, "run", lambda: dx.run(y, inputs=inputs, client=client, progress=False))
    except dx.DeepxError as err:
        res.update(run_s=None, error=str(err)[:300])
        return
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=0)
    res["equal_to_numpy"] = bool(np.array_equal(out, expected))


def measure_chain(client, n: int, folder: Path) -> dict:
    res = {"kind": "chain", "n": n}
    y = timed(res, "build", lambda: chain(n))
    x = np.random.default_rng(0).standard_normal((1000, 100))
    compile_and_explain(res, y, {"x": x})
    spec = folder / f"chain{n}.yaml"
    timed(res, "to_yaml", lambda: dx.to_yaml(y, spec))
    res["spec_bytes"] = spec.stat().st_size
    timed(res, "from_yaml", lambda: dx.from_yaml(spec))
    cli = timed(res, "cli_explain", lambda: subprocess.run(
        [sys.executable, "-m", "deepx_flow.cli.main", "explain", str(spec)], cwd=ROOT,
        capture_output=True, text=True))
    assert cli.returncode == 0, cli.stderr[-2000:]
    run_checked(res, client, y, {"x": x}, chain_reference(x, n))
    return res


def measure_concat(client, n: int, kind: str) -> dict:
    rng = np.random.default_rng(n)
    if kind == "concat of slices":
        def build():
            x = dx.input("x", (n, 8), "float64")
            return dx.concat([x[i:i + 1] for i in range(n)])
        inputs = {"x": rng.standard_normal((n, 8))}
        expected = inputs["x"]
    else:
        def build():
            return dx.concat([dx.input(f"x{i}", (1, 8), "float64") for i in range(n)])
        inputs = {f"x{i}": rng.standard_normal((1, 8)) for i in range(n)}
        expected = np.concatenate([inputs[f"x{i}"] for i in range(n)])
    res = {"kind": kind, "n": n}
    y = timed(res, "build", build)
    compile_and_explain(res, y, inputs)
    run_checked(res, client, y, inputs, expected)
    return res


def main(quick: bool = False) -> dict:
    res = {"machine": common.machine_info(),
           "busy_before": None if quick else common.wait_until_quiet(timeout=300.0)}
    chains = [500, 1000, 2000] if quick else [5000, 10_000, 20_000]
    concats = [100, 200, 500] if quick else [1000, 2000, 5000]
    res["parameters"] = {"chains": chains, "concats": concats, "workers": 2,
                         "threads_per_worker": 1, "repeat": 1}
    runs = []
    with tempfile.TemporaryDirectory() as tmp, common.local_cluster(2) as client:
        compile_and_explain({}, chain(2), {"x": np.ones((1000, 100))})  # one-time set-up
        for n in chains:
            runs.append(measure_chain(client, n, Path(tmp)))
            print(f"chain {n}: done", flush=True)
        for kind in ("concat of slices", "concat of inputs"):
            for n in concats:
                runs.append(measure_concat(client, n, kind))
                print(f"{kind} {n}: done", flush=True)
    res["runs"] = runs

    def s(r: dict, step: str) -> str:
        if f"{step}_s" not in r:
            return "-"
        if r[f"{step}_s"] is None:
            return "failed"
        return f"{r[f'{step}_s']:.2f} ({r[f'{step}_cpu_s']:.2f})"

    steps = ("build", "compile", "explain", "from_yaml", "cli_explain", "lower", "run")
    common.print_table(
        ("graph", "n", "nodes", *(f"{step} s" for step in steps), "tasks"),
        [(r["kind"], f"{r['n']:,}", f"{r['nodes']:,}", *(s(r, step) for step in steps),
          f"{r['tasks_lowered']:,}") for r in runs],
        "Large graphs: wall seconds (CPU seconds) for each step, one timing each")

    largest = [r for r in runs if r["kind"] == "chain"][-1]
    explain_s = largest["compile_s"] + largest["explain_s"]
    explain_cpu_s = largest["compile_cpu_s"] + largest["explain_cpu_s"]
    targets = {
        "chain_compile_explain_s": common.target(
            f"dx.compile + explain of a {largest['n']:,}-node chain < 5 s", explain_s,
            explain_s < 5, cpu_s=explain_cpu_s),
        "chain_cli_explain_s": common.target(
            f"deepx-flow explain of a {largest['n']:,}-node spec < 5 s",
            largest["cli_explain_s"], largest["cli_explain_s"] < 5,
            cpu_s=largest["cli_explain_cpu_s"])}
    for kind in ("chain", "concat of slices", "concat of inputs"):
        of_kind = [r for r in runs if r["kind"] == kind]
        small, big = of_kind[0], of_kind[-1]
        for step in ("compile_s", "run_s"):
            if small[step] is None or big[step] is None:
                targets[f"{kind} {step} linear"] = common.target(
                    f"{kind}: {step} at {big['n']:,} within 2x {small['n']:,}'s per node",
                    None, False)
                continue
            ratio = (big[step] / big["n"]) / (small[step] / small["n"])
            targets[f"{kind} {step} linear"] = common.target(
                f"{kind}: {step} per node at {big['n']:,} within 2x of {small['n']:,}'s",
                ratio, ratio < 2)
    res["targets"] = targets
    common.write_results("bench_graph_size", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    main(parser.parse_args().quick)
