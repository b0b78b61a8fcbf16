"""Every SDK's generated operator code is what sdks/generate.py writes from the operator table
now (CI fails on a table changed without regenerating), and every SDK folder has a generator."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sdks"))

from generate import generated, languages  # noqa: E402


def test_the_generated_files_are_current():
    done = subprocess.run([sys.executable, str(ROOT / "sdks" / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_sdk_has_a_generator_that_writes_only_into_its_own_folder():
    folders = sorted(p.name for p in (ROOT / "sdks").iterdir()
                     if p.is_dir() and (p / "conformance.sh").is_file())
    assert languages() == folders
    for path in generated():
        assert path.split("/")[0] in folders, path
