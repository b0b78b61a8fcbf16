"""`deepx-flow explain` and `run` refuse every bad graph before anything runs: exit code 2,
one line naming the file and node, no traceback. Values behind `full`, `random_*` and
`read_zarr` are checked when the graph is read or its inputs bound, so `run` refuses them
before it contacts a cluster (the scheduler address below has nothing behind it: a run that
got that far would fail to connect, with exit 1)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import deepx_flow as dx
from deepx_flow.errors import InputError
from tests.helpers import free_port

CLUSTER = Path(__file__).resolve().parents[2] / "graphs" / "clusters" / "8xH100.yaml"


def cli(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def refused(res, *words):
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 500, res.stderr[:2000]
    assert all(w in lines[0] for w in words), lines[0]


def spec(node: str) -> str:
    return f"deepx: 1\nnodes:\n - {node}\n - {{id: y, op: exp, args: [h]}}\noutputs: [y]\n"


BAD_VALUES = {
    "int8_fill": ("{id: h, op: full, shape: [4], dtype: int8, attrs: {value: 1000}}",
                  ["1000", "int8"]),
    "nan_std": ("{id: h, op: random_normal, shape: [4], dtype: float32, "
                "attrs: {seed: 0, std: .nan}}", ["std"]),
    "low_above_high": ("{id: h, op: random_uniform, shape: [4], dtype: float32, "
                       "attrs: {seed: 0, low: 3.0, high: 1.0}}", ["low", "high"]),
    "missing_zarr": ("{id: h, op: read_zarr, shape: [4], dtype: float32, "
                     "attrs: {uri: nowhere.zarr}}", ["nowhere.zarr"]),
    "zarr_shape": ("{id: h, op: read_zarr, shape: [5], dtype: float32, "
                   "attrs: {uri: a.zarr}}", ["a.zarr", "(5,)", "(4,)"]),
    "zarr_dtype": ("{id: h, op: read_zarr, shape: [4], dtype: float64, "
                   "attrs: {uri: a.zarr}}", ["a.zarr", "float64", "float32"]),
}


@pytest.fixture
def folder(tmp_path):
    arr = zarr.create_array(tmp_path / "a.zarr", shape=(4,), chunks=(2,), dtype="float32")
    arr[:] = np.arange(4, dtype="float32")
    return tmp_path


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_explain_refuses_values_it_can_check(folder, case):
    node, words = BAD_VALUES[case]
    (folder / "g.yaml").write_text(spec(node))
    res = cli("explain", "g.yaml", "--cluster", str(CLUSTER), cwd=folder)
    refused(res, "g.yaml", "'h'", *words)


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_run_refuses_them_before_contacting_a_cluster(folder, case):
    node, words = BAD_VALUES[case]
    (folder / "g.yaml").write_text(spec(node))
    start = time.perf_counter()
    res = cli("run", "g.yaml", "--scheduler", f"tcp://127.0.0.1:{free_port()}", cwd=folder)
    refused(res, "g.yaml", "'h'", *words)
    assert time.perf_counter() - start < 60


def test_a_good_zarr_source_still_runs(folder, client):
    y = dx.exp(dx.read_zarr(str(folder / "a.zarr")))
    np.testing.assert_allclose(dx.run(y, client=client), np.exp(np.arange(4.0)), rtol=1e-6)


def test_python_runs_check_stored_arrays_before_connecting(folder):
    graph = dx.from_yaml(spec(BAD_VALUES["zarr_shape"][0].replace("a.zarr",
                                                                   str(folder / "a.zarr"))))
    with pytest.raises(InputError, match=r"node 'h'.*\(5,\)"):
        dx.run(graph, scheduler=f"tcp://127.0.0.1:{free_port()}")


@pytest.mark.parametrize("text,words", [
    ("deepx: 1\nnodes: " + "[" * 3000 + "]" * 3000 + "\noutputs: [x]\n", ["nested"]),
    ("deepx: 1\nname: &a [*a]\noutputs: [x]\n", ["contains itself"]),
    ("deepx: 1\ninputs:\n  x: {shape: [4, 3], dtype: float32}\nnodes:\n"
     " - {id: h, op: sum, args: [x], attrs: {axes: 1.5}}\noutputs: [h]\n", ["'h'", "1.5"]),
    ("deepx: 1\ninputs:\n  x: {shape: [" + ", ".join(["1"] * 65) + "], dtype: float32}\n"
     "outputs: [x]\n", ["'x'", "65 dimensions"]),
])
def test_explain_refuses_malformed_graphs(tmp_path, text, words):
    (tmp_path / "g.yaml").write_text(text)
    refused(cli("explain", "g.yaml", cwd=tmp_path), "g.yaml", *words)


def test_explain_refuses_a_plan_over_the_task_limit(tmp_path):
    (tmp_path / "g.yaml").write_text(
        "deepx: 1\ninputs:\n  x: {shape: [1099511627776, 1048576], dtype: float32}\n"
        "nodes:\n - {id: y, op: exp, args: [x]}\noutputs: [y]\n")
    refused(cli("explain", "g.yaml", cwd=tmp_path), "g.yaml", "tasks", "DEEPX_MAX_TASKS")
