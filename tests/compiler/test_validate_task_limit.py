"""A plan over the task limit (DEEPX_MAX_TASKS) is a PlanError, found before any chunk grid
or Dask graph is built: a graph of billions of tasks is refused in a moment, not planned for
minutes or until the driver runs out of memory."""

from __future__ import annotations

import time

import pytest

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.config import Settings, settings
from deepx_flow.errors import PlanError, SettingsError
from deepx_flow.spec.yaml_io import from_yaml
from tests.helpers import cluster_with_memory

CLUSTER = cluster_with_memory(64 * 2**20, workers=2, threads=2)


def _graph():
    x = dx.input("x", (4096, 2048), "float32")
    w = dx.random.normal((2048, 1024), seed=1)
    return dx.build_graph({"y": dx.relu(x @ w).sum(axis=0), "z": dx.softmax(x * 2.0)})


def test_the_limit_is_the_plan_s_own_task_count():
    graph = _graph()
    tasks = compile_graph(graph, CLUSTER, Settings()).stats().tasks
    assert tasks > 20  # the cluster's small budget makes a real grid
    # At the plan's count it compiles; one below, it is refused, naming both numbers.
    compile_graph(graph, CLUSTER, Settings(max_tasks=tasks))
    with pytest.raises(PlanError) as info:
        compile_graph(graph, CLUSTER, Settings(max_tasks=tasks - 1))
    message = str(info.value)
    assert f"{tasks:,} tasks" in message and f"{tasks - 1:,}" in message
    assert "DEEPX_MAX_TASKS" in message and "\n" not in message


def test_the_message_names_the_node_with_most_tasks():
    x = dx.input("x", (1 << 16, 4096), "float32")
    w = dx.input("w", (4096, 4096), "float32")
    small = dx.input("s", (8,), "float32")
    graph = dx.build_graph({"big": x @ w, "small": small + 1.0})
    with pytest.raises(PlanError) as info:
        compile_graph(graph, CLUSTER, Settings(max_tasks=100))
    # The matmul's tiles times its K chunks, and the trees that sum them, outnumber the
    # chunks of any other node.
    assert f"node '{graph.outputs[0][1]}' (matmul" in str(info.value)


def test_billions_of_tasks_are_refused_fast_with_the_default_limit():
    text = ("deepx: 1\ninputs:\n  x: {shape: [1099511627776, 1048576], dtype: float32}\n"
            "nodes:\n - {id: y, op: sum, args: [x], attrs: {axes: [1]}}\noutputs: [y]\n")
    graph = from_yaml(text)
    start = time.perf_counter()
    with pytest.raises(PlanError) as info:
        compile_graph(graph, CLUSTER, Settings())
    assert time.perf_counter() - start < 5
    assert f"{Settings().max_tasks:,}" in str(info.value)


def test_the_default_limit_is_a_million_and_read_from_the_environment(monkeypatch):
    assert Settings().max_tasks == 1_000_000
    monkeypatch.setenv("DEEPX_MAX_TASKS", "2500")
    assert settings().max_tasks == 2500
    graph = _graph()
    with pytest.raises(PlanError, match="2,500"):
        compile_graph(graph, cluster_with_memory(4 * 2**20, threads=8))


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_a_bad_setting_is_refused_with_its_name(monkeypatch, value):
    monkeypatch.setenv("DEEPX_MAX_TASKS", value)
    with pytest.raises(SettingsError, match="DEEPX_MAX_TASKS"):
        settings()

