"""The benchmark scripts still run (at their `--quick` size) and write their results file.

Timings are not asserted here: speed targets are shown by the full-size runs recorded in
benchmarks/results/. This only keeps the scripts from rotting as the engine changes.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bench_compile", "bench_elementwise", "bench_matmul",
                                  "bench_recording", "bench_assets", "bench_recovery",
                                  "bench_speculation", "bench_ui", "bench_small_runs",
                                  "bench_workloads", "bench_training", "bench_inference",
                                  "bench_scan", "bench_graph_size", "bench_serving",
                                  "plan_scale", "bench_sharded"])
def test_benchmark_quick_run_writes_results(name):
    out = BENCH / "results" / f"{name}.quick.json"
    out.unlink(missing_ok=True)
    res = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick"],
                         capture_output=True, text=True, timeout=300, cwd=BENCH.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["quick"] is True and data["targets"]
    if name == "bench_training":  # run again with OpenBLAS's pins unset, for that run only
        native = json.loads((out.parent / "bench_training.native_blas.quick.json").read_text())
        assert native["targets"] and set(native["blas_pins"].values()) == {None}
        # the second run differs only in the pins: not in the threads its BLAS runs on
        # (a cluster's nannies once left OPENBLAS_NUM_THREADS=1 in the first run's
        # environment, which the second inherited)
        assert native["blas"].get("threads") == data["blas"].get("threads")
        assert "OpenBLAS kernels" in res.stdout
