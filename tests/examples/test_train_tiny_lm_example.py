"""examples/train_tiny_lm.py: the language model's held-out loss is within 2% of the NumPy
float64 reference after the same steps, and the attention blocks' forward memory, sampled,
grows with the sequence length and not with its square."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_lm.py"


@pytest.mark.timeout(900)
def test_the_language_model_reaches_the_reference_loss_and_attention_memory_is_linear(
        tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEEPX_DB_URL", "DEEPX_ASSET_ROOT", "DEEPX_SCHEDULER")}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "30", "--memory"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    found = re.search(r"held-out loss: deepx_flow ([0-9.]+), NumPy reference ([0-9.]+)",
                      done.stdout)
    ours, reference = float(found.group(1)), float(found.group(2))
    assert abs(ours - reference) <= 0.02 * reference, done.stdout
    first = re.search(r"training loss ([0-9.]+) -> ([0-9.]+)", done.stdout)
    assert float(first.group(2)) < float(first.group(1)) - 0.5  # it learned
    peaks = {int(m.group(1)): float(m.group(2)) for m in
             re.finditer(r"^\s+(\d+)\s+([0-9.]+) MiB", done.stdout, re.MULTILINE)}
    assert sorted(peaks) == [512, 1024, 2048, 4096], done.stdout
    # four times the length: four times the memory if linear, sixteen if quadratic
    assert peaks[4096] < 8 * peaks[1024], done.stdout
