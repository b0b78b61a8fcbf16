"""The `group_by_shard` pass: the same results with one task per shard and one for what
combines shards."""

from __future__ import annotations

import dask
import numpy as np
from dask.base import tokenize

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.group import ALL, GROUP_SUFFIX, group_by_shard, group_labels
from deepx_flow.ir.keys import key_name, node_of
from deepx_flow.kernels.grouped import run_group
from deepx_flow.runtime.inputs import ArraySource
from deepx_flow.train.step import build_step
from tests.helpers import cluster_with_memory


def _step():
    model = dx.nn.Sequential(dx.nn.Linear(6, 5, dtype="float64"), dx.nn.tanh,
                             dx.nn.Linear(5, 3, dtype="float64"))
    shapes = {k: (v.shape, v.dtype) for k, v in model.init(0).items()}
    return build_step(lambda p, x, y: dx.nn.cross_entropy(model(p, x), y), shapes,
                      dx.optim.Adam(lr=0.1), [((60, 6), "float64"), ((60,), "int64")])


def _lowered(step, memory):
    plan = compile_graph(step.graph, cluster_with_memory(memory))
    rng = np.random.default_rng(0)
    sources = {}
    for node in step.graph.inputs:
        value = (rng.integers(0, 3, node.shape) if node.dtype == "int64"
                 else rng.standard_normal(node.shape))
        value = np.asarray(value, dtype=node.dtype)
        sources[node.id] = ArraySource(value, tokenize(value))
    return plan, plan.lower(sources)


def test_grouped_steps_compute_the_same_with_a_task_per_shard():
    step = _step()
    plan, lowered = _lowered(step, 6000)
    x_id = step.batch[0]
    rows = plan.partition.chunks[x_id][0]
    assert len(rows) >= 3  # several shards
    roots = {k: (0, k[1]) for k in lowered.dsk if node_of(key_name(k)) == x_id}
    keep = {k for name in lowered.outputs for k in lowered.output_keys(name)}
    grouped = group_by_shard(lowered.dsk, roots, keep, "step")
    groups = {k[2] for k in grouped if key_name(k) == "step" + GROUP_SUFFIX}
    assert groups == {str(i) for i in range(len(rows))} | {ALL}
    assert all(grouped[k].args[0] is run_group for k in grouped
               if key_name(k) == "step" + GROUP_SUFFIX)
    assert len(grouped) < len(lowered.dsk) / 2
    assert keep <= set(grouped)
    plain = dask.get(lowered.dsk, sorted(keep, key=repr))
    fewer = dask.get(grouped, sorted(keep, key=repr))
    for a, b in zip(plain, fewer):
        np.testing.assert_array_equal(a, b)


def test_a_single_shard_is_one_group_and_nothing_is_left_over():
    step = _step()
    plan, lowered = _lowered(step, 2**30)
    x_id = step.batch[0]
    assert len(plan.partition.chunks[x_id][0]) == 1
    roots = {k: (0, k[1]) for k in lowered.dsk if node_of(key_name(k)) == x_id}
    keep = {k for name in lowered.outputs for k in lowered.output_keys(name)}
    grouped = group_by_shard(lowered.dsk, roots, keep, "step")
    groups = [k for k in grouped if key_name(k) == "step" + GROUP_SUFFIX]
    assert groups == [("step" + GROUP_SUFFIX, 0, "0")]
    # Inputs that read no shard joined the group of their only readers; what is left is the
    # group, a task per kept key taking it out of the group's result, and inputs read by
    # both the group and a kept key's task (none here).
    assert len(grouped) == 1 + len(keep)
    plain = dask.get(lowered.dsk, sorted(keep, key=repr))
    fewer = dask.get(grouped, sorted(keep, key=repr))
    for a, b in zip(plain, fewer):
        np.testing.assert_array_equal(a, b)


def test_a_group_is_named_by_the_kinds_of_operator_it_runs():
    """A group's task is no node of the plan: the run's task rows name it by its members'
    operators (a single shard: every task of the step is in the one group)."""
    from deepx_flow.ir.program import operator_label
    step = _step()
    plan, lowered = _lowered(step, 2**30)
    roots = {k: (0, k[1]) for k in lowered.dsk if node_of(key_name(k)) == step.batch[0]}
    keep = {k for name in lowered.outputs for k in lowered.output_keys(name)}
    grouped = group_by_shard(lowered.dsk, roots, keep, "step")
    labels = {n.id: operator_label(n) for n in plan.fused.nodes}
    computed = {node_of(key_name(k)) for k in lowered.dsk}
    kinds = sorted({labels[n].split("[")[0] for n in computed})
    assert {"input", "fused", "sum"} <= set(kinds)
    assert group_labels(grouped, labels) == {"step" + GROUP_SUFFIX: f"group[{', '.join(kinds)}]"}
    assert group_labels(lowered.dsk, labels) == {}  # no group before the pass


def _two_steps(memory):
    """Two consecutive steps lowered as a training lowers them (the second's parameters and
    state bound to the first's outputs), merged: (plan, step graph, first, second, dsk,
    roots, keep)."""
    from deepx_flow.runtime.inputs import KeySource
    step = _step()
    plan, first = _lowered(step, memory)
    names = {**step.params, **step.state}
    rng = np.random.default_rng(1)
    sources = {}
    for node in step.graph.inputs:
        if node.id in names.values():
            key, chunks = first.outputs["new_" + node.id]
            sources[node.id] = KeySource(key, chunks, node.dtype)
        else:
            value = (rng.integers(0, 3, node.shape) if node.dtype == "int64"
                     else rng.standard_normal(node.shape))
            value = np.asarray(value, dtype=node.dtype)
            sources[node.id] = ArraySource(value, tokenize(value, "second"))
    second = plan.lower(sources)
    x_id = step.batch[0]
    dsk = {**first.dsk, **second.dsk}
    roots = {k: (i, k[1]) for i, lowered in enumerate((first, second))
             for k in lowered.dsk if node_of(key_name(k)) == x_id}
    keep = {k for name in ("loss", "grad_norm") for lowered in (first, second)
            for k in lowered.output_keys(name)}
    keep |= {k for name in second.outputs if name.startswith("new_")
             for k in second.output_keys(name)}
    return plan, step, first, second, dsk, roots, keep


def test_consecutive_steps_copy_the_update_into_the_next_steps_shards():
    """Two steps in one graph: the update of step 0 runs inside each shard's group of step 1
    (no group combines step 0's shards), groups read each other's results without tasks
    in between, and every kept value equals the ungrouped graph's."""
    plan, step, first, second, dsk, roots, keep = _two_steps(6000)
    names = {**step.params, **step.state}
    shards = len(plan.partition.chunks[step.batch[0]][0])
    assert shards >= 3
    grouped = group_by_shard(dsk, roots, keep, "steps")
    groups = {k[1:] for k in grouped if key_name(k) == "steps" + GROUP_SUFFIX}
    assert groups == {(0, str(s)) for s in range(shards)} | \
        {(1, str(s)) for s in range(shards)} | {(1, ALL)}
    update = [k for k in first.output_keys("new_" + names["0.weight"])]
    for s in range(shards):  # each of step 1's groups computes step 0's update itself
        members = {t.key for t in grouped[("steps" + GROUP_SUFFIX, 1, str(s))].args[1].value}
        assert set(update) <= members
    for s in range(shards):  # and reads step 0's groups' results directly
        deps = grouped[("steps" + GROUP_SUFFIX, 1, str(s))].dependencies
        assert {("steps" + GROUP_SUFFIX, 0, str(t)) for t in range(shards)} <= deps
    plain = dask.get(dsk, sorted(keep, key=repr))
    fewer = dask.get(grouped, sorted(keep, key=repr))
    for a, b in zip(plain, fewer):
        np.testing.assert_array_equal(a, b)


def test_steps_of_one_shard_each_are_one_task():
    plan, step, first, second, dsk, roots, keep = _two_steps(2**30)
    assert len(plan.partition.chunks[step.batch[0]][0]) == 1
    grouped = group_by_shard(dsk, roots, keep, "steps")
    groups = [k for k in grouped if key_name(k) == "steps" + GROUP_SUFFIX]
    assert groups == [("steps" + GROUP_SUFFIX, 0, "0")]
    members = {t.key for t in grouped[groups[0]].args[1].value}
    assert set(first.output_keys("loss")) <= members and \
        set(second.output_keys("loss")) <= members
    plain = dask.get(dsk, sorted(keep, key=repr))
    fewer = dask.get(grouped, sorted(keep, key=repr))
    for a, b in zip(plain, fewer):
        np.testing.assert_array_equal(a, b)
