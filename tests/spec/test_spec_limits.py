"""Size limits: a spec file past DEEPX_MAX_SPEC_BYTES is refused before it is read, and a graph
of more than DEEPX_MAX_NODES nodes is refused as it is read from a spec or built in Python.
Each refusal is one GraphError (SpecError for a spec) that names the file or graph, the size
and the setting to raise."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.config import Settings
from deepx_flow.errors import GraphError, SpecError
from deepx_flow.ir import Graph
from deepx_flow.registry.cluster import load_cluster_file
from deepx_flow.sdk.build import build_graph
from deepx_flow.spec.yaml_io import from_yaml
from tests.cli.test_cli_validation import cli, refused

CLUSTER = load_cluster_file(Path(__file__).resolve().parents[2] / "graphs" / "clusters"
                            / "8xH100.yaml")


def chain_spec(nodes: int, inputs: int = 1) -> str:
    """`inputs` inputs and a chain of `nodes` nodes adding them up."""
    lines = ["deepx: 1", "inputs:"]
    lines += [f"  x{i}: {{shape: [4], dtype: float32}}" for i in range(inputs)]
    lines.append("nodes:")
    previous = "x0"
    for i in range(nodes):
        lines.append(f" - {{id: n{i}, op: add, args: [{previous}, x{i % inputs}]}}")
        previous = f"n{i}"
    lines.append(f"outputs: [{previous}]")
    return "\n".join(lines) + "\n"


def memory_peak(fn) -> tuple[BaseException, int]:
    """The error `fn()` raises and the most memory Python held meanwhile (bytes)."""
    tracemalloc.start()
    try:
        with pytest.raises(GraphError) as info:
            fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value, peak


def test_the_defaults():
    assert Settings().max_spec_bytes == 16 * 2**20 and Settings().max_nodes == 100_000


def test_a_spec_file_past_the_limit_is_refused_unread(tmp_path):
    # 60 MB took 74 s to refuse; its size alone says it is too large. The file is sparse:
    # refused by its size, it is never read (Python holds far less than the file).
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.write(b"deepx: 1\n")
        f.truncate(60_000_000)
    err, peak = memory_peak(lambda: from_yaml(path))
    assert type(err) is SpecError
    message = str(err)
    assert str(path) in message and "57.2 MiB" in message and "60,000,000 bytes" in message
    assert "16.0 MiB" in message and "DEEPX_MAX_SPEC_BYTES" in message, message
    assert peak < 2**20, peak


def test_the_spec_size_limit_is_a_setting(tmp_path, monkeypatch):
    path = tmp_path / "g.yaml"
    path.write_text(chain_spec(20))
    assert len(from_yaml(path).nodes) == 21
    monkeypatch.setenv("DEEPX_MAX_SPEC_BYTES", str(path.stat().st_size - 1))
    with pytest.raises(SpecError, match=r"DEEPX_MAX_SPEC_BYTES=\d+: raise it"):
        from_yaml(path)
    with pytest.raises(SpecError, match="the spec text: is .*DEEPX_MAX_SPEC_BYTES"):
        from_yaml(path.read_text())  # the same text given as a string
    monkeypatch.setenv("DEEPX_MAX_SPEC_BYTES", str(path.stat().st_size))
    assert len(from_yaml(path).nodes) == 21


def test_a_file_whose_size_is_not_known_is_read_only_to_the_limit(monkeypatch):
    # /dev/zero states a size of 0 and never ends: read past the limit, it is refused.
    monkeypatch.setenv("DEEPX_MAX_SPEC_BYTES", str(2**20))
    err, peak = memory_peak(lambda: from_yaml(Path("/dev/zero")))
    assert type(err) is SpecError and "/dev/zero: holds more" in str(err)
    assert "DEEPX_MAX_SPEC_BYTES" in str(err)
    assert peak < 8 * 2**20, peak


@pytest.mark.parametrize("inputs, nodes", [(1, 9), (9, 1), (4, 6)])
def test_a_spec_of_more_nodes_than_the_limit_is_refused(tmp_path, monkeypatch, inputs, nodes):
    monkeypatch.setenv("DEEPX_MAX_NODES", "10")
    path = tmp_path / "g.yaml"
    path.write_text(chain_spec(nodes, inputs))
    graph = from_yaml(path)  # ten inputs and nodes: as many as allowed
    assert len(graph.nodes) == inputs + nodes
    path.write_text(chain_spec(nodes + 1, inputs))
    with pytest.raises(SpecError) as info:
        from_yaml(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line ") and "11 inputs and nodes" in message, message
    assert "more than the 10 a graph may have (DEEPX_MAX_NODES=10: raise it" in message


def test_the_node_limit_bounds_the_values_a_spec_may_hold(monkeypatch):
    # One node with a huge attribute list holds the values of many nodes.
    monkeypatch.setenv("DEEPX_MAX_NODES", "10")
    values = ", ".join(["1"] * 400)
    text = ("deepx: 1\nnodes:\n - {id: h, op: full, shape: [], dtype: float32, "
            f"attrs: {{value: 0.0, junk: [{values}]}}}}\noutputs: [h]\n")
    with pytest.raises(SpecError) as info:
        from_yaml(text)
    assert "more than 320 values" in str(info.value) and "DEEPX_MAX_NODES=10" in str(info.value)


def test_a_graph_built_in_python_is_refused_as_it_is_walked(monkeypatch):
    monkeypatch.setenv("DEEPX_MAX_NODES", "10")
    x = dx.input("x", (4,), "float32")
    y = x
    for _ in range(9):
        y = y * 2.0  # x, the constant 2.0 and nine products: eleven nodes
    with pytest.raises(GraphError) as info:
        build_graph(y)
    assert "more nodes than the 10 a graph may have (DEEPX_MAX_NODES=10" in str(info.value)
    with pytest.raises(GraphError, match="DEEPX_MAX_NODES"):
        dx.compile(y)
    monkeypatch.setenv("DEEPX_MAX_NODES", "11")
    assert len(build_graph(y).nodes) == 11


def test_compile_refuses_any_graph_past_the_limit():
    # A graph made without the SDK (a pass's output, another tool's): counted at compile.
    graph = from_yaml(chain_spec(10))
    plan = compile_graph(graph, CLUSTER, Settings(max_nodes=11))
    assert len(plan.graph.nodes) == 11
    with pytest.raises(GraphError) as info:
        compile_graph(Graph(graph.nodes, graph.outputs), CLUSTER, Settings(max_nodes=10))
    assert "the graph has 11 nodes, more than the 10" in str(info.value)


def test_a_bad_limit_is_refused(monkeypatch):
    for value in ("0", "-5", "many"):
        monkeypatch.setenv("DEEPX_MAX_NODES", value)
        with pytest.raises(dx.DeepxError, match="DEEPX_MAX_NODES must be a whole number of nodes, 1 or more"):
            from_yaml(chain_spec(1))


def test_the_cli_refuses_a_huge_spec_in_one_line(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.truncate(60_000_000)
    res = cli("explain", str(path))
    refused(res, str(path), "57.2 MiB", "DEEPX_MAX_SPEC_BYTES")
    env = {**os.environ, "DEEPX_MAX_NODES": "3"}
    path.write_text(chain_spec(5))
    res = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "explain", str(path)],
                         capture_output=True, text=True, timeout=120, env=env)
    refused(res, str(path), "6 inputs and nodes", "DEEPX_MAX_NODES=3")
