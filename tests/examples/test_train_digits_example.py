"""examples/train_digits.py trains to at least 95% held-out accuracy, end to end."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


@pytest.mark.timeout(600)
def test_the_digits_example_reaches_95_percent(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEEPX_DB_URL", "DEEPX_ASSET_ROOT", "DEEPX_SCHEDULER")}
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(re.search(r"held-out accuracy: ([0-9.]+)", done.stdout).group(1))
    assert accuracy >= 0.95, done.stdout
    assert (tmp_path / ".deepx" / "deepx.db").exists()  # the runs were recorded
