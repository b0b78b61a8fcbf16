"""Short tasks last (`runtime/priorities.py`): the lowering says what each key's chunk indices
index, a task at most half a full one of its key name gets priority -1, and Dask's scheduler
orders by it."""

import math

import numpy as np

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.runtime.inputs import bind_inputs
from deepx_flow.runtime.priorities import SHORT, ShortLast
from tests.helpers import cluster_with_memory


def _graph():
    x = dx.random.normal((1000, 48), seed=1, dtype="float64")
    w = dx.random.normal((48, 6), seed=2, dtype="float64")
    return {"ew": dx.tanh(x) * 2.0 + 1.0, "col": (x * x).sum(axis=0),
            "gram": dx.transpose(x) @ x, "proj": x @ w}


def test_every_key_indexes_its_grid_and_short_ones_come_last():
    plan = compile_graph(dx.build_graph(_graph()), cluster_with_memory(96 * 2**10), check=True)
    low = plan.lower(bind_inputs(plan.graph, None))
    assert any(len(set(sizes)) > 1 for grid in low.grids.values() for sizes in grid), \
        "the budget makes ragged grids"
    priority = ShortLast(low.grids)
    seen_short = seen_full = 0
    for key in low.dsk:
        grid = low.grids.get(key[0]) if isinstance(key, tuple) else None
        if grid is None:
            assert priority(key) == 0
            continue
        index = key[1:]
        assert len(index) == len(grid) and all(i < len(s) for i, s in zip(index, grid)), key
        size = math.prod(s[i] for s, i in zip(grid, index))
        full = math.prod(max(s) for s in grid)
        short = size <= SHORT * full
        assert priority(key) == (-1 if short else 0), key
        seen_short += short
        seen_full += not short
    assert seen_short and seen_full
    # the reduction's and the split matmul's partial keys are covered too
    assert {k[0].rsplit(".", 1)[-1] for k in low.dsk if isinstance(k, tuple) and
            priority(k) == -1} >= {"partial"}


def _priorities(keys, dask_scheduler=None):
    return {str(k): dask_scheduler.tasks[k].priority for k in keys}


def test_the_scheduler_orders_a_ragged_chunk_after_the_full_ones(client):
    x = dx.random.uniform((1000, 64), seed=3, dtype="float64")
    y = dx.exp(x) - x
    kept = dx.persist(y, client=client, cluster=cluster_with_memory(64 * 2**10))
    sizes = kept.chunks[0]
    assert len(sizes) > 2 and sizes[-1] <= SHORT * sizes[0]
    keys = [f.key for f in kept.futures]
    prios = client.run_on_scheduler(_priorities, keys)
    firsts = [prios[str(k)][0] for k in keys]
    last_rows = [i for i, k in enumerate(keys) if k[1] == len(sizes) - 1]
    assert all(firsts[i] == 1 for i in last_rows)  # -priority: lower
    assert all(f == 0 for i, f in enumerate(firsts) if i not in last_rows)
    got = kept.to_numpy()
    kept.release()
    xv = dx.run(x, client=client)
    np.testing.assert_allclose(got, np.exp(xv) - xv, rtol=1e-12)
