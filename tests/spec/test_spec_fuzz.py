"""Fuzz test of the YAML reader: `deepx-flow explain` on seeded mutations of graphs/*.yaml.

`fuzz_driver.py` mutates the example specs (values, keys, operators, dtypes, shapes,
attributes, fused programs, operands; the text itself: truncation, stray characters, deep
nesting, self-referencing aliases, alias bombs) and runs the command's `main` on each in one
subprocess, under a 2 GiB address-space limit and with a 10 s alarm per case. Every case must
end with exit code 0 or 2, at most one line on stderr, no traceback, and a message of bounded
length that names the file. The cases are the same on every run (seeded), so a failure
reproduces with `python tests/spec/fuzz_driver.py --seed SEED --only N --workdir DIR`.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("fuzz_driver.py")
SEED = 14
# About 5 ms a case; with the imports, about 15 s on a 2-core machine.
CASES = 2000
MEMORY = 2 * 2**30


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="needs RLIMIT_AS")
def test_fuzzed_specs_exit_0_or_2_with_one_line(tmp_path):
    env = dict(os.environ, PYTHONHASHSEED="0", DEEPX_RECORD="0")
    env.pop("DEEPX_MAX_TASKS", None)
    proc = subprocess.run([sys.executable, str(DRIVER), "--seed", str(SEED), "--cases",
                           str(CASES), "--workdir", str(tmp_path)], capture_output=True,
                          text=True, timeout=300, preexec_fn=_limit_memory, env=env)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    last = rows[-1]["case"] if rows else None
    assert proc.returncode == 0 and len(rows) == CASES, (
        f"the driver stopped after case {last}: {proc.stderr[-3000:]}")

    def wrong(row) -> str | None:
        lines = row["stderr"].strip().splitlines()
        if row["rc"] not in (0, 2):
            return f"exit code {row['rc']}"
        if "Traceback" in row["stderr"] or len(lines) > 1:
            return "more than one line"
        if row["stderr_chars"] > 1100:
            return f"a message of {row['stderr_chars']} characters"
        if row["rc"] == 2 and not (lines and lines[0].startswith("deepx-flow: error: ")
                                   and f"case{row['case']}.yaml" in lines[0]):
            return "a message that does not name the file"
        return None

    bad = [(row, why) for row in rows if (why := wrong(row))]
    assert not bad, "\n".join(
        f"case {row['case']} {row['mutations']}: {why}: {row['stderr'][:300]!r}"
        for row, why in bad[:10]) + f"\n(reproduce: python {DRIVER} --seed {SEED} --only N " \
                                    "--workdir DIR)"
    # The mutations reach both ends: most specs are refused, a good share still compiles.
    assert sum(row["rc"] == 0 for row in rows) > CASES // 20
    assert max(row["seconds"] for row in rows) < 10
