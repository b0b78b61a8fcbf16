"""The placement of a training step's parameters (`compiler/placing/`): each strategy's
memory and traffic, the ring collectives' cost, and the choice, which always fits the
workers' memory or raises a PlanError saying why."""

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.placing import (PARAMETER_SHARE, STRATEGIES, place_parameters,
                                         trained_parameters)
from deepx_flow.compiler.placing.collectives import BUCKET, Collectives
from deepx_flow.errors import PlanError
from deepx_flow.registry.cluster import ClusterSpec, LinkSpec, WorkerSpec, load_cluster_file
from deepx_flow.train.step import build_step
from tests.helpers import cluster_with_memory

ROOT = Path(__file__).resolve().parents[2]


def mlp_step(widths, batch, optimizer=None):
    """The step graph of an MLP with layers of `widths`, on batches of `batch` rows."""
    shapes = {}
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        shapes[f"w{i}"] = ((a, b), "float32")
        shapes[f"b{i}"] = ((b,), "float32")

    def loss_fn(p, x, y):
        h = x
        for i in range(len(widths) - 1):
            h = h @ p[f"w{i}"] + p[f"b{i}"]
            if i < len(widths) - 2:
                h = dx.relu(h)
        return ((h - y) ** 2).mean()
    return build_step(loss_fn, shapes, optimizer or dx.optim.Adam(1e-3),
                      [((batch, widths[0]), "float32"), ((batch, widths[-1]), "float32")])


def place(step, cluster, **kw):
    return place_parameters(step.graph, step.params, step.state, cluster, **kw)


def test_the_parameters_are_found_with_their_state_and_their_matmuls():
    step = mlp_step([8, 16, 4], batch=32)
    found = {p.name: p for p in trained_parameters(step.graph, step.params, step.state)}
    assert set(found) == {"w0", "b0", "w1", "b1"}
    assert found["w0"].state_slots == 2 and found["w0"].copies == 4  # Adam's m and v
    assert found["w0"].nbytes == 8 * 16 * 4
    (use,) = found["w0"].uses
    assert (use.rows, use.k, use.n, use.itemsize) == (32, 8, 16, 4)
    assert found["b0"].uses == ()
    sgd = mlp_step([8, 16, 4], batch=32, optimizer=dx.optim.SGD(0.1))
    assert all(p.state_slots == 0 for p in trained_parameters(sgd.graph, sgd.params,
                                                               sgd.state))


def test_collectives_send_what_the_hierarchical_ring_algorithms_send():
    one_host = Collectives(1, 4, 1e9, 1e-5, 0.0, 0.0)
    assert one_host.sent("all_gather", 4000) == one_host.sent("reduce_scatter", 4000) == 3000
    assert one_host.sent("all_reduce", 4000) == 6000
    # a bucket's latency, shared by the bytes of the tensor
    assert one_host.seconds("all_reduce", BUCKET) == pytest.approx(
        2 * (0.75 * BUCKET / 1e9 + 3 * 1e-5))
    assert Collectives(1, 1, 1e9, 1e-5, 0.0, 0.0).seconds("all_reduce", 4000) == 0
    # 4 hosts of 8: across hosts 3/4 of an eighth each, then 7/8 inside a host
    nodes = Collectives(4, 8, 400e9, 2e-6, 50e9, 5e-6)
    assert nodes.sent("all_gather", 8000) == pytest.approx(7000 + 750)
    # all-to-all: each worker sends the other 31 their parts of its 1/32
    assert nodes.sent("all_to_all", 32000) == pytest.approx(1000 * 31 / 32)
    flat = 2 * 31 / 32 * 8e9 / 50e9  # one ring of 32 over the links between hosts
    assert nodes.seconds("all_reduce", 8e9) < flat / 3
    spec = load_cluster_file(ROOT / "graphs/clusters/2x4xH200.yaml")
    assert Collectives.of(spec) == Collectives(2, 4, 450e9, 2e-6, 50e9, 5e-6)
    uneven = _cluster(3, 2**30, 2)  # hosts of 2 and 1 workers: one ring between hosts
    assert (Collectives.of(uneven).hosts, Collectives.of(uneven).per_host) == (3, 1)


def test_each_strategy_keeps_and_moves_what_it_says():
    step = mlp_step([64, 128, 8], batch=16)
    p = next(q for q in trained_parameters(step.graph, step.params, step.state)
             if q.name == "w0")
    n, size = 4, 64 * 128 * 4
    rep, shard, tp = STRATEGIES["replicated"], STRATEGIES["sharded"], \
        STRATEGIES["tensor_parallel"]
    assert rep.kept(p, n) == 4 * size and rep.collectives(p, n) == [("all_reduce", size)]
    # a quarter of the parameter and of its two state tensors between steps; the whole
    # parameter and its whole gradient for a moment
    assert shard.kept(p, n) == 3 * size // 4 and shard.gathered(p, n) == 2 * size
    assert [k for k, _ in shard.collectives(p, n)] == ["all_gather", "all_gather",
                                                       "reduce_scatter"]
    uneven = replace(p, shape=(66, 128))  # rows 17, 17, 16, 16: the largest shard kept
    assert shard.kept(uneven, n) == 3 * 17 * 128 * 4
    # a quarter of the columns and of their state; the whole batch's rows of x held, and
    # the gradient's quarter from the backward pass to the update
    assert tp.kept(p, n) == 3 * size // 4 and tp.gathered(p, n) == 16 * 64 * 4 + size // 4
    assert tp.collectives(p, n) == [("all_gather", 16 * 64 * 4), ("all_to_all", 16 * 128 * 4),
                                    ("all_to_all", 16 * 128 * 4),
                                    ("reduce_scatter", 16 * 64 * 4)]
    assert not tp.applies(trained_parameters(step.graph, step.params, step.state)[1], n)


def test_a_large_batch_on_small_weights_is_data_parallel_and_a_small_batch_splits_weights():
    cluster = load_cluster_file(ROOT / "graphs/clusters/8xH100.yaml")
    big_batch = place(mlp_step([256, 256, 8], batch=65536), cluster)
    assert set(big_batch.strategies()) == {"replicated"}
    small_batch = place(mlp_step([4096, 4096, 8], batch=8), cluster)
    assert small_batch["w0"].strategy == "tensor_parallel"


def test_a_model_too_large_for_one_worker_is_sharded_to_fit():
    step = mlp_step([1024, 1024, 1024, 1024, 16], batch=64)
    total = sum(p.copies * p.nbytes for p in trained_parameters(step.graph, step.params,
                                                                step.state))
    memory = int(total / 2 / PARAMETER_SHARE)  # parameters and state twice the share
    cluster = cluster_with_memory(memory, workers=4)
    with pytest.raises(PlanError, match="replicated"):
        place(step, cluster, strategy="replicated")
    placed = place(step, cluster)
    assert placed.kept <= placed.limit == int(memory * PARAMETER_SHARE)
    assert set(placed.strategies()) - {"replicated"}
    assert all(p.kept <= p.parameter.copies * p.parameter.nbytes for p in placed.placed)
    # the weights make room; the biases, whose change would save little, stay replicated
    assert all(p.strategy == "replicated" for p in placed.placed if len(p.parameter.shape) == 1)


def test_what_cannot_fit_anyhow_is_refused_naming_the_largest_parameter():
    step = mlp_step([2048, 2048, 16], batch=8)
    with pytest.raises(PlanError, match=r"'w0' \(2048, 2048\).*more workers"):
        place(step, cluster_with_memory(2 * 2**20, workers=2))
    with pytest.raises(PlanError, match="unknown placement 'zero'"):
        place(step, cluster_with_memory(2**30), strategy="zero")


def test_explain_shows_every_parameter_its_choice_and_the_step():
    placed = place(mlp_step([64, 128, 8], batch=16), cluster_with_memory(2**30, workers=4))
    text = placed.explain()
    for p in placed.placed:
        assert p.parameter.name in text and p.strategy in text
    assert "kept per worker" in text and "compute/communication" in text
    assert placed.step_seconds == pytest.approx(placed.compute_seconds
                                                + placed.communication_seconds)


def _cluster(workers: int, memory: int, hosts: int) -> ClusterSpec:
    return ClusterSpec("c", tuple(WorkerSpec(f"w{i}", f"h{i % hosts}", 1, memory)
                                  for i in range(workers)),
                       (LinkSpec("host", "tcp", 5e9, 1e-5), LinkSpec("cluster", "tcp", 1e9, 5e-5)))


@settings(max_examples=40, deadline=None)
@given(widths=st.lists(st.sampled_from([8, 32, 64, 256, 512]), min_size=2, max_size=4),
       batch=st.sampled_from([1, 16, 256, 4096]), workers=st.integers(1, 8),
       hosts=st.integers(1, 2), memory_kib=st.integers(16, 16384))
def test_the_choice_fits_whenever_some_placement_fits(widths, batch, workers, hosts,
                                                      memory_kib):
    step = mlp_step(widths, batch)
    cluster = _cluster(workers, memory_kib * 1024, hosts)
    trained = trained_parameters(step.graph, step.params, step.state)
    # every parameter at its fewest bytes (kept and gathered): refused only if that fails
    least = [min((s for s in STRATEGIES.values() if s.applies(p, workers)),
                 key=lambda s: s.kept(p, workers) + s.gathered(p, workers)) for p in trained]
    floor = sum(s.kept(p, workers) for s, p in zip(least, trained)) + max(
        s.gathered(p, workers) for s, p in zip(least, trained))
    limit = int(memory_kib * 1024 * PARAMETER_SHARE)
    try:
        placed = place(step, cluster)
    except PlanError as err:
        assert floor > limit, str(err)
        return
    assert placed.kept <= limit
    assert math.isclose(placed.communication_seconds, sum(p.seconds for p in placed.placed))
    if workers == 1:
        assert set(placed.strategies()) == {"replicated"}
