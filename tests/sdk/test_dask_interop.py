"""`dx.from_dask` and `dx.to_dask` (`sdk/dask_interop.py`): round trips equal NumPy in float64
whatever the dask chunking (hypothesis); the dask array's tasks join the run's graph and its
chunks are read by the tasks that use them; to_dask's arrays are chunked as the plan and work
with dask's own schedulers, persist, arithmetic and da.compute."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.sdk.build import build_graph
from tests.helpers import cluster_with_memory


def chunking(draw, n: int) -> tuple[int, ...]:
    """A random partition of `n` into chunks (irregular ones included)."""
    if n == 0:
        return (0,)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(4, n - 1)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


OPS = {
    "identity": (lambda t: t, lambda a: a),
    "elementwise": (lambda t: np.tanh(t) * 2.0 + t, lambda a: np.tanh(a) * 2.0 + a),
    "exp_sum": (lambda t: np.exp(t).sum(axis=-1), lambda a: np.exp(a).sum(axis=-1)),
    "max0": (lambda t: np.max(t, axis=0, keepdims=True),
             lambda a: np.max(a, axis=0, keepdims=True)),
    "mean_all": (lambda t: t.mean(), lambda a: a.mean()),
    "slice": (lambda t: t[1:] - 1.0, lambda a: a[1:] - 1.0),
}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_round_trips_equal_numpy_whatever_the_chunks(client, data):
    shape = tuple(data.draw(st.lists(st.integers(2, 9), min_size=1, max_size=3), label="shape"))
    chunks = tuple(chunking(data.draw, n) for n in shape)
    op = data.draw(st.sampled_from(sorted(OPS)), label="op")
    seed = data.draw(st.integers(0, 99), label="seed")
    # the plan's own grid: one chunk, or several that cut across the dask chunks
    memory = data.draw(st.sampled_from([None, 2**12, 2**13]), label="memory")
    cluster = cluster_with_memory(memory) if memory else None
    array = np.random.default_rng(seed).standard_normal(shape)
    source = da.from_array(array, chunks=chunks) * 1.0  # a graph of tasks, not only data
    build, reference = OPS[op]
    want = reference(array)
    y = build(dx.from_dask(source))

    got = dx.run(y, client=client, cluster=cluster)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    out = dx.to_dask(y, client=client, cluster=cluster)
    assert isinstance(out, da.Array) and out.shape == np.shape(want)
    plan = dx.compile(y, client=client, cluster=cluster)
    assert out.chunks == plan.partition.chunks[build_graph(y).outputs[0][1]]
    np.testing.assert_allclose(out.compute(scheduler=client), want, rtol=1e-12, atol=1e-12)

    # and back: a dask computation on deepx_flow's array, read by deepx_flow again
    again = dx.from_dask(dx.to_dask(y, client=client, cluster=cluster) + 1.0)
    np.testing.assert_allclose(dx.run(again, client=client, cluster=cluster), want + 1.0,
                               rtol=1e-12, atol=1e-12)


def test_the_dask_tasks_join_the_run_graph(client):
    array = np.arange(60.0).reshape(6, 10)
    source = da.from_array(array, chunks=(4, 3)) + 1.0
    out = dx.to_dask(dx.from_dask(source) * 2.0, client=client)
    graph = dict(out.__dask_graph__())
    source_keys = {k for row in source.__dask_keys__() for k in row}
    assert source_keys <= set(graph)  # dask's chunk tasks are in the graph, as dependencies
    readers = [key for key, task in graph.items() if source_keys & set(task.dependencies)]
    assert readers and all(key[0].startswith("mul-") for key in readers)  # read where used
    np.testing.assert_array_equal(out.compute(scheduler="sync"), (array + 1.0) * 2.0)


def test_to_dask_works_as_a_dask_array(client):
    x = dx.input("x", (40, 6), "float64")
    array = np.random.default_rng(1).standard_normal((40, 6))
    y = np.exp(x) @ np.ones((6, 3))
    out = dx.to_dask(y, inputs={"x": array}, client=client)
    want = np.exp(array) @ np.ones((6, 3))
    np.testing.assert_allclose(out.compute(scheduler=client), want, rtol=1e-12)
    np.testing.assert_allclose(out.compute(scheduler="threads"), want, rtol=1e-12)
    persisted = client.persist(out)
    np.testing.assert_allclose((persisted * 2 - 1).sum(axis=0).compute(scheduler=client),
                               (want * 2 - 1).sum(axis=0), rtol=1e-12)
    a, b = dx.to_dask([y, y.sum()], inputs={"x": array}, client=client)
    got_a, got_b = dask.compute(a, b, scheduler=client)
    np.testing.assert_allclose(got_b, want.sum(), rtol=1e-12)
    named = dx.to_dask({"y": y}, inputs={"x": array}, client=client)
    assert set(named) == {"y"} and named["y"].shape == (40, 3)


def test_from_dask_reads_persisted_and_0d_and_empty_arrays(client):
    array = np.random.default_rng(2).standard_normal((13, 7))
    persisted = client.persist(da.from_array(array, chunks=(5, 3)) * 3.0)
    np.testing.assert_allclose(dx.run(dx.from_dask(persisted) + 1.0, client=client),
                               array * 3.0 + 1.0, rtol=1e-12)
    assert dx.run(dx.from_dask(da.from_array(np.float64(3.5))) * 2.0, client=client) == 7.0
    empty = dx.run(dx.from_dask(da.zeros((0, 4), chunks=(1, 2))) + 1.0, client=client)
    assert empty.shape == (0, 4)
    ints = da.arange(10, chunks=3, dtype="int32")
    np.testing.assert_array_equal(dx.run(np.cumsum(dx.from_dask(ints)), client=client),
                                  np.cumsum(np.arange(10, dtype="int32")))


def test_inputs_given_by_name_and_yaml(client, tmp_path):
    array = np.arange(12.0).reshape(3, 4)
    source = da.from_array(array, chunks=2)
    x = dx.from_dask(source, name="x")
    assert x.name == "x" and x.node.op == "input" and x.shape == (3, 4)
    other = da.from_array(array * 10, chunks=3)
    np.testing.assert_array_equal(dx.run(x + 1.0, inputs={"x": other}, client=client),
                                  array * 10 + 1.0)  # what inputs= names wins
    path = tmp_path / "g.yaml"
    path.write_text(dx.to_yaml(x * 2.0))  # an ordinary input in YAML
    graph = dx.from_yaml(path)
    got = dx.run(graph, inputs={"x": source}, client=client)
    np.testing.assert_array_equal(next(iter(got.values())), array * 2.0)
    # dask arrays are taken for a plain dx.input as well
    np.testing.assert_array_equal(
        dx.run(dx.input("z", (3, 4), "float64") - 1.0, inputs={"z": source}, client=client),
        array - 1.0)


def test_what_from_dask_refuses(client):
    array = da.from_array(np.arange(10.0), chunks=3)
    with pytest.raises(dx.InputError, match=r"unknown size \(NaN\) along axis 0.*"
                                            r"compute_chunk_sizes"):
        dx.from_dask(array[array > 3])
    with pytest.raises(dx.GraphError, match="takes a dask.array.Array, got a ndarray"):
        dx.from_dask(np.arange(3.0))
    with pytest.raises(dx.InputError, match="unsupported dtype dtype.'complex128'.; use one"):
        dx.from_dask(array.astype("complex128"))
    with pytest.raises(dx.GraphError, match="name must be an identifier"):
        dx.from_dask(array, name="a b")
    a, b = dx.from_dask(array, name="v"), dx.from_dask(array + 1, name="v")
    with pytest.raises(dx.GraphError, match="two different dask arrays are bound to input 'v'"):
        dx.run(a + b, client=client)
    lying = array.map_blocks(lambda block: block.astype("float32"), dtype="float64")
    with pytest.raises(dx.DataError, match=r"is float32 of shape \(3,\), but the array states "
                                           r"float64"):
        dx.run(dx.from_dask(lying) + 1.0, client=client)


def test_xarray_wraps_to_dask():
    xr = pytest.importorskip("xarray")
    array = np.arange(12.0).reshape(3, 4)
    wrapped = xr.DataArray(da.from_array(array, chunks=2), dims=("a", "b"))
    t = dx.from_dask(wrapped)
    back = xr.DataArray(dx.to_dask(np.exp(t)), dims=("a", "b"))
    np.testing.assert_allclose(back.sum("b").values, np.exp(array).sum(1), rtol=1e-12)
