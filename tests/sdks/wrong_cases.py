"""Cases and scenarios made wrong on purpose, for each SDK's test that its conformance runner
fails them (so that a pass means something): one right case beside them, and for each
wrong one the words its failure line must hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / "sdks" / "conformance"


def _read(kind: str, name: str) -> dict:
    return json.loads((SUITE / kind / f"{name}.json").read_text())


def write_wrong_cases(folder: Path, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """Write right.json and the wrong cases into `folder` (but those named in `leave_out`);
    the wrong ones' names (each case's name is its file's) -> what their failure says."""
    right = _read("cases", "op_add")
    wrong = {}
    graph = json.loads(json.dumps(right))
    graph["spec"]["nodes"][0]["op"] = "sub"
    wrong["wrong_graph"] = (graph, "the graph the steps build")
    result = json.loads(json.dumps(right))
    result["expected"]["y"]["data"][0] += 0.001
    wrong["wrong_result"] = (result, "y[0]")
    # an int where the case has a float is another graph: numbers are compared as written
    # (not in JavaScript, whose numbers are one kind)
    number = _read("cases", "op_random_uniform")
    assert number["spec"]["nodes"][0]["attrs"]["low"] == -1.0
    number["spec"]["nodes"][0]["attrs"]["low"] = -1
    wrong["wrong_number"] = (number, "the graph the steps build")
    # -0.0 is not 0.0 where a case is exact
    signed = _read("cases", "dtype_float32")
    at = [str(v) for v in signed["expected"]["y"]["data"]].index("-0.0")
    signed["expected"]["y"]["data"][at] = 0.0
    wrong["wrong_zero"] = (signed, f"y[{at}]")
    # a scenario whose asset reads back other values than it says
    read = _read("scenarios", "assets")
    next(c for c in read["scenario"] if c["do"] == "read_asset")["expected"]["data"][2] += 1
    wrong["wrong_read"] = (read, "call 5 (read_asset)")
    # a scenario whose analysis gives another shape than it says
    analysis = _read("scenarios", "analyze")
    analysis["scenario"][0]["analysis"]["outputs"][0]["shape"] = [3, 6]
    wrong["wrong_analysis"] = (analysis, "call 1 (analyze)")
    (folder / "right.json").write_text(json.dumps(right))
    said = {}
    for name, (case, words) in wrong.items():
        if name in leave_out:
            continue
        case["name"] = name
        (folder / f"{name}.json").write_text(json.dumps(case))
        said[name] = words
    return said


def unsaid(stdout: str, said: dict[str, str]) -> list[str]:
    """The wrong cases that no failure line of `stdout` names with its words."""
    lines = [line for line in stdout.splitlines() if line.startswith("FAILED")]
    return [name for name, words in said.items()
            if not any(re.search(rf"\b{name}\b", line) and words in line for line in lines)]
