"""`benchmarks/gpu/run_all.sh` on a machine without a GPU gets as far as saying so, in one
line, and exits 1 having measured nothing; so does the benchmark script it runs. (On a GPU
machine they measure, which takes minutes: not here.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu_here() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


pytestmark = pytest.mark.skipif(_gpu_here(), reason="a GPU is here: run_all.sh would measure")


def test_run_all_says_in_one_line_that_there_is_no_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "DEEPX_INSTALL_WHL")}
    env["PYTHON"] = sys.executable
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu" / "run_all.sh")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("run_all.sh: no GPU here (") and \
        lines[0].endswith("); nothing measured")


def test_the_gpu_benchmark_says_so_too():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "bench_gpu.py")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1 and done.stderr == ""
    assert done.stdout.startswith("bench_gpu: no GPU here: ") and done.stdout.count("\n") == 1
