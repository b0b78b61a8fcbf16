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


def test_without_scikit_learn_it_says_which_extra_to_install(tmp_path):
    """scikit-learn made unimportable (as where the `examples` extra is not installed): one
    line naming the extra, exit code 2, no traceback."""
    run_without_sklearn = ("import runpy, sys; sys.modules['sklearn'] = None; "
                           f"sys.argv = [{str(EXAMPLE)!r}]; "
                           f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", run_without_sklearn], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert 'pip install -e ".[examples]"' in done.stderr and "scikit-learn" in done.stderr
    assert done.stdout == ""
