"""Inputs placed in pieces (`partition_graph(..., splits)`) and the regrids that keep a
sharded parameter's pieces apart from the arithmetic (`compiler/placing/gather.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.placing.gather import gathered_where_used
from deepx_flow.errors import PlanError
from deepx_flow.registry.cluster import load_cluster_file
from tests.compiler.test_placing import mlp_step

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = load_cluster_file(ROOT / "graphs/clusters/8xH100.yaml")


def _outputs(plan):
    return dict(plan.fused.outputs)


def test_a_split_input_is_in_its_pieces_and_its_update_with_it():
    step = mlp_step([64, 256, 8], batch=32)
    w, m, v = step.params["w0"], step.state["m/w0"], step.state["v/w0"]
    splits = {i: (0, 8) for i in (w, m, v)}
    plan = compile_graph(step.graph, CLUSTER, splits=splits)
    chunks = plan.partition.chunks
    for i in (w, m, v):
        assert chunks[i][0] == (8,) * 8, i  # one piece per worker, never cut finer
        assert chunks[_outputs(plan)["new_" + i]][0] == (8,) * 8
    assert plan.partition.splits == splits
    whole = compile_graph(step.graph, CLUSTER)
    assert whole.partition.chunks[w][0] == (64,)


def test_a_split_that_names_no_source_axis_or_too_many_pieces_is_refused():
    step = mlp_step([64, 256, 8], batch=32)
    last = step.params["w1"]
    compile_graph(step.graph, CLUSTER, splits={last: (1, 8)})
    with pytest.raises(PlanError, match="not a source"):
        compile_graph(step.graph, CLUSTER, splits={"nothing": (0, 2)})
    with pytest.raises(PlanError, match="cannot be split in 300 pieces"):
        compile_graph(step.graph, CLUSTER, splits={last: (0, 300)})
    with pytest.raises(PlanError, match="along axis 2"):
        compile_graph(step.graph, CLUSTER, splits={last: (2, 2)})


def test_a_gathered_parameter_keeps_its_pieces_out_of_the_arithmetic(client):
    step = mlp_step([16, 24, 4], batch=8)
    w = step.params["w0"]
    sharded = {w, step.state["m/w0"], step.state["v/w0"]}
    graph = gathered_where_used(step.graph, sharded)
    consumers = graph.consumers()
    # the passes read the parameter through a regrid; its update reads it itself
    readers = {graph[u].op for u in consumers[w]}
    assert "slice" in readers and "matmul" not in readers
    regrids = [n for n in graph.nodes if n.op == "slice"]
    assert len(regrids) >= 2  # the parameter's, and its gradient's for the update
    for n in regrids:
        assert n.attr("starts") == (0,) * n.ndim and n.attr("stops") == n.shape
    # the same numbers
    rng = np.random.default_rng(0)
    inputs = {n.id: rng.standard_normal(n.shape).astype(n.dtype) for n in step.graph.inputs}
    names = [name for name, _ in step.graph.outputs]
    before = dx.run(step.graph, inputs=inputs, client=client)
    after = dx.run(graph, inputs=inputs, client=client)
    for name in names:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-6, atol=1e-7)
    # compiled with the pieces: the update in 8 pieces, the regrid the matmuls read whole
    plan = compile_graph(graph, CLUSTER, splits={i: (0, 8) for i in sharded})
    assert len(plan.partition.chunks[_outputs(plan)["new_" + w]][0]) == 8
    gathers = [n.id for n in plan.fused.nodes if n.op == "slice" and n.inputs == (w,)]
    read = [n for n in plan.fused.nodes if n.op == "matmul" and set(n.inputs) & set(gathers)]
    assert gathers and read
    for g in gathers:
        assert plan.partition.chunks[g][0] == (16,)  # the whole of its 16 rows, gathered
