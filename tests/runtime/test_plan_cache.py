"""Plans kept between runs of the same graph (`runtime/plan_cache.py`): a second run of the
same graph on the same cluster compiles nothing; a changed graph, setting or cluster
compiles again; changed input data is bound again on every run. Results against NumPy in
float64."""

from __future__ import annotations

import ast

import numpy as np
import pytest
import zarr

import deepx_flow as dx
from deepx_flow.compiler import compile as compile_module
from deepx_flow.ir import Graph, Node
from deepx_flow.ir.keys import chunk_index
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all
from deepx_flow.runtime import plan_cache
from tests.helpers import cluster_with_memory


@pytest.fixture
def partitions(monkeypatch):
    """Counts the chunk grids worked out: one per compilation (the last pass). Recording is
    off: these tests give the specs the speeds they plan with."""
    monkeypatch.setenv("DEEPX_RECORD", "0")
    calls = []
    real = compile_module.partition_graph

    def counted(graph, cluster, config, splits=None):
        calls.append(graph)
        return real(graph, cluster, config, splits)
    monkeypatch.setattr(compile_module, "partition_graph", counted)
    return calls


def _expected(x: np.ndarray, scale: float) -> np.ndarray:
    return (np.tanh(x) * scale + 1).sum(axis=0)


def _graph(scale: float, shape=(300, 200)):
    x = dx.input("x", shape, "float64")
    return (dx.tanh(x) * scale + 1).sum(axis=0)


def test_a_second_run_of_the_same_graph_compiles_nothing(client, partitions):
    x = np.random.default_rng(0).standard_normal((300, 200))
    first = dx.run(_graph(2.0), inputs={"x": x}, client=client)
    compiled, hits = len(partitions), plan_cache.cache_info().hits
    second = dx.run(_graph(2.0), inputs={"x": x}, client=client)  # built again: equal graph
    assert len(partitions) == compiled
    assert plan_cache.cache_info().hits == hits + 1
    np.testing.assert_allclose(first, _expected(x, 2.0), rtol=1e-12)
    np.testing.assert_allclose(second, _expected(x, 2.0), rtol=1e-12)


def test_a_changed_graph_compiles_again(client, partitions):
    x = np.random.default_rng(1).standard_normal((300, 200))
    dx.run(_graph(3.0), inputs={"x": x}, client=client)
    partitions.clear()
    out = dx.run(_graph(5.0), inputs={"x": x}, client=client)
    assert len(partitions) == 1
    np.testing.assert_allclose(out, _expected(x, 5.0), rtol=1e-12)
    out = dx.run(_graph(3.0, (200, 300)), inputs={"x": x.T.copy()}, client=client)
    assert len(partitions) == 2
    np.testing.assert_allclose(out, _expected(x.T, 3.0), rtol=1e-12)


def test_new_input_data_is_bound_on_every_run(client, partitions):
    """The plan is kept, the data is not: each run computes its own inputs."""
    y = _graph(7.0)
    rng = np.random.default_rng(2)
    dx.run(y, inputs={"x": rng.standard_normal((300, 200))}, client=client)
    partitions.clear()
    for _ in range(3):
        x = rng.standard_normal((300, 200))
        np.testing.assert_allclose(dx.run(y, inputs={"x": x}, client=client),
                                   _expected(x, 7.0), rtol=1e-12)
    assert partitions == []


def test_a_rewritten_zarr_array_is_read_again(client, partitions, tmp_path):
    path = str(tmp_path / "a.zarr")
    rng = np.random.default_rng(3)
    for i in range(3):
        data = rng.standard_normal((120, 80))
        z = zarr.create_array(path, shape=data.shape, chunks=(40, 40), dtype="float64",
                              overwrite=True)
        z[:] = data
        y = (dx.tanh(dx.read_zarr(path)) * 2 + 1).sum(axis=0)
        np.testing.assert_allclose(dx.run(y, client=client), _expected(data, 2.0),
                                   rtol=1e-12)
        # Read as an input file as well: same path, new content.
        x = dx.input("x", data.shape, "float64")
        np.testing.assert_allclose(dx.run(dx.exp(x).sum(axis=1), inputs={"x": path},
                                          client=client), np.exp(data).sum(axis=1),
                                   rtol=1e-12)
        if i == 0:
            compiled = len(partitions)
    assert len(partitions) == compiled  # the same two graphs each time
    # Another shape is another graph (a read_zarr node states its array's shape).
    data = rng.standard_normal((90, 80))
    zarr.create_array(path, shape=data.shape, chunks=(40, 40), dtype="float64",
                      overwrite=True)[:] = data
    y = (dx.tanh(dx.read_zarr(path)) * 2 + 1).sum(axis=0)
    np.testing.assert_allclose(dx.run(y, client=client), _expected(data, 2.0), rtol=1e-12)
    assert len(partitions) == compiled + 1


def test_changed_settings_compile_again(client, partitions, monkeypatch):
    y = _graph(11.0, (4000, 100))
    x = np.random.default_rng(4).standard_normal((4000, 100))
    dx.run(y, inputs={"x": x}, client=client)
    before = dx.compile(y, client=client).chunks
    partitions.clear()
    monkeypatch.setenv("DEEPX_MIN_CHUNK_BYTES", str(64 * 1024))  # smaller chunks
    out = dx.run(y, inputs={"x": x}, client=client)
    assert len(partitions) == 1
    assert dx.compile(y, client=client).chunks != before
    np.testing.assert_allclose(out, _expected(x, 11.0), rtol=1e-12)


def test_another_cluster_spec_compiles_again(partitions):
    y = _graph(13.0, (4000, 1000))
    small = dx.compile(y, cluster=cluster_with_memory(64 * 2**20))
    again = dx.compile(y, cluster=cluster_with_memory(64 * 2**20))
    large = dx.compile(y, cluster=cluster_with_memory(2**34))
    assert len(partitions) == 2
    assert again.chunks == small.chunks and large.chunks != small.chunks


def _measured(spec, plan, flops_per_s: float, labels=None):
    """`spec` with every worker having measured `labels` (default: each of the plan's nodes)
    at `flops_per_s` (and as many bytes per second)."""
    from dataclasses import replace

    from deepx_flow.ir.program import operator_label
    from deepx_flow.registry.speeds import OperatorSpeed
    labels = labels or [operator_label(n) for n in plan.fused.nodes]
    speeds = {label: OperatorSpeed(flops_per_s, flops_per_s, 1) for label in labels}
    return replace(spec, workers=tuple(replace(w, speeds=speeds) for w in spec.workers))


def test_a_kept_plan_takes_the_spec_it_is_given_whatever_speeds_were_measured(partitions):
    """A plan chosen for a graph and a cluster is kept whatever speeds the registry measures
    later (they change after every run, and a plan made for them may cut other chunks, so
    round sums otherwise: issue 31, item 7); it carries the spec of the call, so its
    estimates and the recovery's expected times use the newest speeds."""
    spec = cluster_with_memory(2**30)
    graph = dx.compile(_graph(17.0), cluster=spec).graph
    first = plan_cache.cached_compile(graph, spec)
    for rate in (1e6, 1e9, 1e12):
        measured = _measured(spec, first, rate)
        kept = plan_cache.cached_compile(graph, measured)
        assert kept.cluster is measured and kept.partition is first.partition
    assert len(partitions) == 1
    assert kept.stats().compute_seconds != first.stats().compute_seconds


def test_replan_plans_again_with_the_speeds_of_now_and_keeps_that_plan(partitions):
    """Speeds that change the plan (the planner stops halving below DEEPX_MIN_TASK_SECONDS
    of measured time) take effect when a run asks to plan again, and that plan is kept."""
    y = _graph(23.0, (8192, 512))
    spec = cluster_with_memory(2**32)
    graph = dx.compile(y, cluster=spec).graph
    base = plan_cache.cached_compile(graph, spec)
    slow = plan_cache.cached_compile(graph, _measured(spec, base, 1e6), replan=True)
    assert slow.chunks == compile_module.compile_graph(graph, _measured(spec, base, 1e6)).chunks
    fast_spec = _measured(spec, base, 1e12)
    assert plan_cache.cached_compile(graph, fast_spec).chunks == slow.chunks  # kept
    fast = plan_cache.cached_compile(graph, fast_spec, replan=True)
    assert fast.chunks == compile_module.compile_graph(graph, fast_spec).chunks
    assert slow.chunks != fast.chunks  # the speeds do change this plan
    assert dx.compile(y, cluster=_measured(spec, base, 1e6)).chunks == fast.chunks
    assert dx.compile(y, cluster=_measured(spec, base, 1e6), replan=True).chunks == \
        slow.chunks
    with pytest.raises(dx.GraphError, match="replan must be True or False"):
        dx.compile(y, cluster=spec, replan="yes")


def test_the_key_tells_attribute_types_apart():
    """Graphs equal under == (1 == 1.0 == True) are not the same plan unless written the
    same."""
    one = Graph((Node("c", "full", (), (2,), "float64", (("value", 1),)),), (("y", "c"),))
    other = Graph((Node("c", "full", (), (2,), "float64", (("value", 1.0),)),), (("y", "c"),))
    assert one == other
    assert plan_cache.graph_token(one) != plan_cache.graph_token(other)


def test_each_run_of_a_kept_plan_is_recorded(client, db_url, monkeypatch):
    """Every run records its own row, task rows and a placement for each finished task,
    cached plan or not."""
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    db = open_db(db_url)
    try:
        x = np.random.default_rng(5).standard_normal((300, 200))
        for _ in range(3):
            dx.run(_graph(19.0), inputs={"x": x}, client=client)
        runs = queries.list_runs(db)
        assert len(runs) == 3 and {r.status for r in runs} == {"succeeded"}
        assert len({r.graph_hash for r in runs}) == 1
        for run in runs:
            tasks = queries.run_tasks(db, run.id)
            assert len(tasks) == run.n_tasks and {t.status for t in tasks} == {"memory"}
            placed = {(p.tensor, p.chunk, p.worker)
                      for p in queries.placements(db, run_id=run.id, current=False)}
            assert {(t.tensor, chunk_index(ast.literal_eval(t.key)), t.worker)
                    for t in tasks} <= placed
    finally:
        close_all()
