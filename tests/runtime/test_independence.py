"""Results do not depend on the chunk grid or on the number of workers (hypothesis).

Each example builds a graph with random tensors, elementwise chains, a matmul and reductions,
plans it for clusters of different sizes and memories (so the chunk grids differ), runs it on
a 2-worker and a 3-worker cluster, and compares every run with the first and with NumPy.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from tests.helpers import cluster_with_memory


def reference(x, w, b):
    h = np.tanh(x @ w + b) * 2.0 - 1.0
    return h.sum(axis=1), np.exp(-np.abs(h)).mean(axis=0), h.max()


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 90), k=st.integers(1, 40), n=st.integers(1, 50),
       seed=st.integers(0, 2**31),
       plans=st.lists(st.tuples(st.sampled_from([2**30, 64 * 2**10, 16 * 2**10, 6 * 2**10]),
                                st.integers(1, 4)), min_size=2, max_size=3))
def test_results_do_not_depend_on_grid_or_workers(client, client3, m, k, n, seed, plans):
    x = dx.random.normal((m, k), seed=seed, dtype="float64")
    w = dx.random.uniform((k, n), seed=seed + 1, low=-1.0, high=1.0, dtype="float64")
    b = dx.input("b", (n,), "float64")
    h = dx.tanh(x @ w + b) * 2.0 - 1.0
    outs = [h.sum(axis=1), dx.exp(-dx.abs(h)).mean(axis=0), h.max()]
    b_np = np.linspace(-1, 1, n)

    results, grids = [], set()
    for i, (memory, workers) in enumerate(plans):
        spec = cluster_with_memory(memory, workers=workers)
        try:
            plan = compile_graph(dx.build_graph(outs), spec)
        except dx.PlanError:
            continue
        grids.add(str(sorted(plan.chunks.items())))
        on = client if i % 2 == 0 else client3
        results.append(dx.run(outs, inputs={"b": b_np}, client=on, cluster=spec))
    if not results:
        return
    x_np = dx.run(x, client=client)
    w_np = dx.run(w, client=client3, cluster=cluster_with_memory(6 * 2**10))
    expected = reference(x_np, w_np, b_np)
    for got in results:
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-9)
    # Random tensors are bit-identical whatever the grid.
    np.testing.assert_array_equal(x_np, dx.run(x, client=client3,
                                               cluster=cluster_with_memory(6 * 2**10)))
