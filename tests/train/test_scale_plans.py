"""The plans of docs/scale.md: 1.5B and 7B parameter transformers on 16 and 256 H100s fit
every GPU's memory, are what benchmarks/results/plan_scale.json records, and are what the
doc's table says."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "benchmarks/results/plan_scale.json").read_text())["plans"]


def plan_scale():
    spec = importlib.util.spec_from_file_location("plan_scale",
                                                  ROOT / "benchmarks/plan_scale.py")
    module = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,cluster", [("1.5B", "2x8xH100"), ("7B", "32x8xH100")])
def test_the_plans_fit_every_gpu_and_are_those_recorded(model, cluster):
    planned = plan_scale().plan_for(model, cluster)
    assert planned["memory_per_gpu"] <= planned["gpu_memory"]
    assert planned["kept_bytes"] + planned["live_bytes"] + planned["task_bytes"] == \
        planned["memory_per_gpu"]
    if model == "7B":  # 107 GB of parameters, gradients and Adam state: not replicable
        assert planned["strategies"].get("sharded", 0) > 0
    (recorded,) = [r for r in RECORDED if (r["model"], r["cluster"]) == (model, cluster)]
    for key in ("sequences_per_gpu", "strategies", "memory_per_gpu", "flops"):
        assert planned[key] == recorded[key], key
    assert planned["step_s"] == pytest.approx(recorded["step_s"], rel=1e-9)


def test_the_doc_states_the_recorded_plans():
    text = (ROOT / "docs/scale.md").read_text()
    rows = re.findall(r"^\| (1\.5B|7B) \| (\d+) \| (\d+) \| [\d,]+ \| [^|]+ \| ([\d.]+) \| "
                      r"([\d.]+) s \|", text, re.MULTILINE)
    assert len(rows) == len(RECORDED) == 6
    for model, gpus, per_gpu, gib, step in rows:
        (r,) = [r for r in RECORDED if r["model"] == model and r["gpus"] == int(gpus)]
        assert r["sequences_per_gpu"] == int(per_gpu)
        assert float(gib) == round(r["memory_per_gpu"] / 2**30, 1)
        assert float(step) == round(r["step_s"], 2)
        assert r["memory_per_gpu"] <= r["gpu_memory"]
