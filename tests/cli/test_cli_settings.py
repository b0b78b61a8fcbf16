"""`deepx-flow` refuses a bad `DEEPX_*` value before any command: exit 2, one line on stderr
naming the variable, no traceback (issue 30, item 7). Each kind of bad value named in the
issue (abc, -1, 0, nan, inf, 1e400) is tried in a process of its own; every setting that has
a range or a form gets one through `main` in this process (a Python start-up with deepx_flow
imported takes seconds here); `tests/test_config.py` tries every bad value on every setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from deepx_flow.cli.main import main
from deepx_flow.config import READERS, Address, Flag, Number, Text

IN_A_PROCESS = [
    ("DEEPX_MEMORY_FRACTION", "abc"),
    ("DEEPX_CHUNKS_PER_THREAD", "-1"),
    ("DEEPX_MIN_CHUNK_BYTES", "0"),
    ("DEEPX_REDUCE_FANIN", "nan"),
    ("DEEPX_HEARTBEAT_S", "inf"),
    ("DEEPX_MEMORY_FRACTION", "1e400"),
]

CASES = [
    ("DEEPX_MEMORY_FRACTION", "abc"),
    ("DEEPX_MEMORY_FRACTION", "-1"),
    ("DEEPX_MEMORY_FRACTION", "1e400"),
    ("DEEPX_MIN_CHUNK_BYTES", "0"),
    ("DEEPX_CHUNKS_PER_THREAD", "-1"),
    ("DEEPX_REDUCE_FANIN", "nan"),
    ("DEEPX_MAX_TASKS", "1.5"),
    ("DEEPX_MAX_SPEC_BYTES", "0"),
    ("DEEPX_MAX_NODES", "-5"),
    ("DEEPX_GC_GRACE_S", "-1"),
    ("DEEPX_MIN_TASK_SECONDS", "inf"),
    ("DEEPX_HEARTBEAT_S", "0"),
    ("DEEPX_HEARTBEAT_TIMEOUT_S", "1e400"),
    ("DEEPX_OPERATION_TTL_S", "0"),
    ("DEEPX_PROGRESS_AFTER_S", "nan"),
    ("DEEPX_BUFFER_POOL_BYTES", "-1"),
    ("DEEPX_RECORD", "maybe"),
    ("DEEPX_DASHBOARD_URL", "localhost:5006"),
    ("DEEPX_SCHEDULER", "tcp://10.0.0.1"),
]


def refused(code: int, out: str, err: str, variable: str, text: str) -> None:
    assert code == 2, (variable, text, code, err[-2000:])
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, (variable, text, err[-2000:])
    assert lines[0].startswith(f"deepx-flow: error: {variable} must be ")
    assert lines[0].endswith(f"got {text!r}")


def test_every_setting_with_a_range_or_a_form_is_tried():
    assert {r.variable for r in READERS if not isinstance(r.kind, Text) or r.kind.prefixes} \
        == {variable for variable, _ in CASES}
    assert not [r for r in READERS if not isinstance(r.kind, (Number, Text, Flag, Address))]


@pytest.mark.parametrize("variable, text", CASES)
def test_a_bad_setting_is_refused_by_the_command(monkeypatch, capsys, variable, text):
    monkeypatch.setenv(variable, text)
    code = main(["ops"])
    captured = capsys.readouterr()
    refused(code, captured.out, captured.err, variable, text)


def test_a_bad_setting_is_one_line_and_exit_2_from_the_process():
    # Started together (each is a Python start-up), then read one by one.
    started = []
    for variable, text in IN_A_PROCESS:
        env = dict(os.environ, **{variable: text})
        started.append((variable, text, subprocess.Popen(
            [sys.executable, "-m", "deepx_flow.cli.main", "ops"], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for variable, text, process in started:
        out, err = process.communicate(timeout=300)
        refused(process.returncode, out, err, variable, text)


def test_a_heartbeat_timeout_below_the_beat_is_refused_by_the_command(monkeypatch, capsys):
    monkeypatch.setenv("DEEPX_HEARTBEAT_S", "10")
    monkeypatch.setenv("DEEPX_HEARTBEAT_TIMEOUT_S", "5")
    code = main(["ops"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "Traceback" not in captured.err
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("deepx-flow: error: DEEPX_HEARTBEAT_TIMEOUT_S (5 s) must be more "
                           "than DEEPX_HEARTBEAT_S (10 s)")
