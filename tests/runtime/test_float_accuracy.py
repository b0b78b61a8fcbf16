"""float32 and float16 sums and means add up in float64, in each chunk and across the tree.

So whatever the chunk grid and the number of workers, a result is the exact sum (or mean)
rounded once to the result's dtype, give or take one unit in the last place, and it is at least
as close to the exact answer as NumPy's own float32 reduction. Before, each chunk summed in
float32: a column variance of a (4,000,000 x 256) uniform tensor came out 0.08287 to 0.08338
depending on the cluster (exact 1/12 = 0.08333). The grids come from the registry, as in real
use: the same graph is planned for workers with less and less memory.
"""

import numpy as np
from hypothesis import HealthCheck, example, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from tests.helpers import assert_within_ulps, cluster_with_memory, exact_sum

# Worker memories giving one chunk, a few, and many small uneven ones (for the sizes below).
MEMORIES = (2**30, 64 * 2**10, 16 * 2**10, 6 * 2**10)


def make_data(shape, seed, kind, offset, dtype):
    """Random data of `dtype`: uniform in [0, 1), signed uniform or normal, plus `offset`;
    "alternating" adds +offset and -offset in turn, so a sum cancels all but the noise."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        noise = rng.standard_normal(shape)
    elif kind == "signed":
        noise = rng.uniform(-1.0, 1.0, shape)
    else:
        noise = rng.random(shape)
    if kind == "alternating":
        sign = np.where(np.arange(np.prod(shape)).reshape(shape) % 2 == 0, 1.0, -1.0)
        return (sign * offset + noise).astype(dtype)
    return (offset + noise).astype(dtype)


def run_grids(client, client3, outputs, feed, memories, grid_of="x"):
    """Run `outputs` planned for each worker memory, alternating 2 and 3 workers; return the
    results and the distinct chunk grids of the tensor `grid_of`."""
    results, grids = [], set()
    for i, memory in enumerate(memories):
        spec = cluster_with_memory(memory, workers=2 + i % 2)
        plan = compile_graph(dx.build_graph(outputs), spec)
        grids.add(str(plan.chunks[grid_of]))
        results.append(dx.run(outputs, inputs=feed, client=client if i % 2 == 0 else client3,
                              cluster=spec))
    return results, grids


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 700), cols=st.integers(1, 24), seed=st.integers(0, 2**32 - 1),
       kind=st.sampled_from(["uniform", "signed", "normal", "alternating"]),
       offset=st.sampled_from([0.0, 1e4, -3.0]), axis=st.sampled_from([None, 0, 1]),
       dtype=st.sampled_from(["float32", "float32", "float16"]),
       memories=st.lists(st.sampled_from(MEMORIES), min_size=2, max_size=3, unique=True))
@example(rows=700, cols=24, seed=1, kind="uniform", offset=1e4, axis=0, dtype="float32",
         memories=list(MEMORIES[:3]))
@example(rows=700, cols=24, seed=2, kind="alternating", offset=1e4, axis=None,
         dtype="float32", memories=list(MEMORIES[1:]))
def test_sums_and_means_are_the_float64_answer_rounded_once(client, client3, rows, cols, seed,
                                                            kind, offset, axis, dtype,
                                                            memories):
    if dtype == "float16":
        offset = min(offset, 3.0)  # float16 sums of 1e4s overflow (its largest is 65504)
    x_np = make_data((rows, cols), seed, kind, offset, dtype)
    x = dx.input("x", x_np.shape, dtype)
    results, _ = run_grids(client, client3, [x.sum(axis=axis), x.mean(axis=axis)],
                           {"x": x_np}, memories)

    total = exact_sum(x_np, axis)
    count = x_np.size if axis is None else x_np.shape[axis]
    numpy_sum, numpy_mean = np.sum(x_np, axis=axis), np.mean(x_np, axis=axis)
    for got_sum, got_mean in results:
        assert got_sum.dtype == got_mean.dtype == dtype
        # (a) The exact answer rounded once: the same, within one rounding, on every grid.
        assert_within_ulps(got_sum, total, 1)
        assert_within_ulps(got_mean, total / count, 1)
        # (b) At least as close to the exact answer as NumPy's float32 (float16) reduction.
        for got, mine in ((got_sum, numpy_sum), (got_mean, numpy_mean)):
            ours = np.abs(got.astype(np.float64) - (total if got is got_sum else total / count))
            theirs = np.abs(mine.astype(np.float64) - (total if got is got_sum else
                                                        total / count))
            assert np.all(ours <= theirs), (np.max(ours - theirs), got, mine)
    first_sum, first_mean = results[0]
    for got_sum, got_mean in results[1:]:
        assert_within_ulps(got_sum, first_sum.astype(np.float64), 1)
        assert_within_ulps(got_mean, first_mean.astype(np.float64), 1)


def test_column_variance_of_a_tall_uniform_tensor_does_not_depend_on_the_grid(client, client3):
    # The example, scaled down: a column variance as mean((x - mean(x))**2). Summing
    # 200,000 float32 rows in float32 drifts by thousands of ulps, differently per grid.
    rows, cols = 200_000, 8
    x = dx.random.uniform((rows, cols), seed=15, dtype="float32")
    var = ((x - x.mean(axis=0)) ** 2).mean(axis=0)
    results, grids = run_grids(client, client3, [var], {},
                               (2**30, 4 * 2**20, 512 * 2**10, 96 * 2**10), x.node.id)
    assert len(grids) == 4

    x_np = dx.run(x, client=client).astype(np.float64)
    exact = exact_sum((x_np - x_np.mean(axis=0)) ** 2, axis=0) / rows
    for (got,) in results:
        assert got.dtype == np.float32
        # Each element of (x - mean)**2 is rounded to float32 before the sum; those roundings
        # are unbiased and average out, so a few ulps of the float64 variance.
        assert_within_ulps(got, exact, 4)
        np.testing.assert_allclose(got, 1 / 12, rtol=1e-2)  # and it is a uniform's variance
    for (got,) in results[1:]:
        assert_within_ulps(got, results[0][0].astype(np.float64), 1)
