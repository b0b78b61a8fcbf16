"""The inline pass: views and single-use source reads are computed inside their readers.

Each lowered graph is run in this process (Dask's synchronous scheduler), with and without
the pass, and compared with NumPy in float64; the structural tests look at the keys left.
"""

import itertools
import math

import dask
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.ir.keys import node_of
from deepx_flow.runtime.inputs import bind_inputs
from tests.helpers import assert_sums_close, cluster_with_memory


def lowered(outputs, memory, inputs=None, inline=True, workers=2):
    plan = compile_graph(dx.build_graph(outputs), cluster_with_memory(memory, workers),
                         check=True)
    return plan, plan.lower(bind_inputs(plan.graph, inputs), inline=inline)


def evaluate(outputs, memory, inputs=None, inline=True, workers=2) -> list:
    """Every output of the lowered graph (planned for `workers` workers), assembled from its
    chunks."""
    plan, low = lowered(outputs, memory, inputs, inline, workers)
    results = []
    for name, _ in plan.graph.outputs:
        _, chunks = low.outputs[name]
        keys = low.output_keys(name)
        values = dask.get(low.dsk, keys)
        out = np.empty(tuple(sum(c) for c in chunks), dtype=values[0].dtype)
        starts = [np.cumsum((0,) + c[:-1]) for c in chunks]
        for idx, value in zip(itertools.product(*(range(len(c)) for c in chunks)), values):
            at = tuple(slice(s[i], s[i] + n) for s, i, n in zip(starts, idx, value.shape))
            out[at] = value
        results.append(out)
    return results


def ops_left(low) -> set:
    return {node_of(k[0]).split("-")[0] for k in low.dsk if isinstance(k, tuple)}


def test_a_transpose_read_by_a_matmul_is_a_blas_flag_not_a_task(tmp_path):
    x = np.random.default_rng(0).standard_normal((3000, 40))
    g = np.random.default_rng(1).standard_normal((3000, 7))
    np.save(tmp_path / "x.npy", x)
    tx = dx.input("x", x.shape, "float64")
    tg = dx.input("g", g.shape, "float64")
    y = dx.transpose(tx) @ tg
    inputs = {"x": str(tmp_path / "x.npy"), "g": g}
    plan, low = lowered(y, 256 * 2**10, inputs)
    assert len(plan.chunks["x"][0]) > 1  # the contraction is split: partials are summed
    assert "transpose" not in ops_left(low)
    assert not [k for k in low.dsk if isinstance(k, tuple) and node_of(k[0]) == "x"], \
        "the .npy input is read inside the matmul tasks"
    (got,) = evaluate(y, 256 * 2**10, inputs)
    np.testing.assert_allclose(got, x.T @ g, rtol=1e-12, atol=1e-9)


def test_a_source_read_twice_by_one_task_is_read_once():
    x = dx.random.normal((4000, 32), seed=3, dtype="float64")
    plan, low = lowered(dx.transpose(x) @ x, 128 * 2**10)
    reads = [k for k in low.dsk if isinstance(k, tuple) and node_of(k[0]).startswith("random")]
    assert len(reads) == len(plan.chunks[x.node.id][0]) > 1
    assert "transpose" not in ops_left(low)
    xv = evaluate(x, 2**30)[0]
    (got,) = evaluate(dx.transpose(x) @ x, 128 * 2**10)
    np.testing.assert_allclose(got, xv.T @ xv, rtol=1e-12, atol=1e-9)


def test_a_stored_array_is_read_inside_its_only_reader(tmp_path):
    data = np.random.default_rng(2).standard_normal((5000, 16)).astype("float32")
    store = zarr.create_array(tmp_path / "x.zarr", shape=data.shape, chunks=(500, 16),
                              dtype="float32")
    store[...] = data
    x = dx.read_zarr(str(tmp_path / "x.zarr"))
    y = dx.tanh(x).sum(axis=0)
    plan, low = lowered(y, 64 * 2**10)
    assert "read_zarr" not in ops_left(low)
    (got,) = evaluate(y, 64 * 2**10)
    t = np.tanh(data.astype(np.float64))
    assert_sums_close(got, t.sum(axis=0), np.abs(t).sum(axis=0), rtol=1e-6)
    # Read by two nodes (the mean and the centring): read once, kept as a task.
    centred = ((x - x.mean(axis=0)) ** 2).sum(axis=0)
    _, low = lowered(centred, 64 * 2**10)
    assert "read_zarr" in ops_left(low)


def test_views_of_views_and_whole_chunk_layouts_leave_no_tasks():
    x = dx.random.normal((64, 48), seed=5, dtype="float64")
    y = dx.transpose(dx.transpose(x)) * 2.0
    z = dx.reshape(x, (64, 6, 8)).sum(axis=2)
    w = x[16:48] + 1.0
    for out in (y, z, w):  # x read by one node: inside that node's tasks
        assert ops_left(lowered(out, 2**30)[1]) == {out.node.id.split("-")[0]}
    # x read by three nodes: read once, its views computed by their readers.
    _, low = lowered([y, z, w], 2**30)
    assert ops_left(low) & {"transpose", "reshape", "slice"} == set()
    assert "random_normal" in ops_left(low)
    xv = evaluate(x, 2**30)[0]
    got = evaluate([y, z, w], 2**30)
    np.testing.assert_allclose(got[0], xv * 2.0, rtol=1e-15)
    np.testing.assert_allclose(got[1], xv.reshape(64, 6, 8).sum(axis=2), rtol=1e-13)
    np.testing.assert_allclose(got[2], xv[16:48] + 1.0, rtol=1e-15)


def test_an_output_that_is_a_view_is_still_an_output():
    x = dx.random.normal((50, 30), seed=9, dtype="float64")
    t = dx.transpose(x)
    got = evaluate([t, t @ x], 2**30)
    xv = evaluate(x, 2**30)[0]
    np.testing.assert_array_equal(got[0], xv.T)
    np.testing.assert_allclose(got[1], xv.T @ xv, rtol=1e-12)


def test_a_long_chain_of_views_does_not_nest_without_bound():
    x = dx.random.normal((8, 6), seed=1, dtype="float64")
    y = x
    for _ in range(300):
        y = dx.transpose(y)
    (got,) = evaluate(y * 1.0, 2**30)
    np.testing.assert_array_equal(got, evaluate(x, 2**30)[0])


# -- results do not change (hypothesis) ---------------------------------------------------
MEMORIES = [2**30, 256 * 2**10, 64 * 2**10, 24 * 2**10]


def build(kind: int, x, g):
    """One of several graphs mixing layout operators, sources, matmuls and reductions."""
    m, k = x.shape
    if kind == 0:
        return dx.transpose(x) @ g
    if kind == 1:
        return dx.transpose(x) @ x
    if kind == 2:
        return dx.transpose(dx.transpose(x)) + dx.tanh(x)
    if kind == 3:
        return (x[: m // 2] * 2.0).sum(axis=0)
    if kind == 4:
        return dx.concat([x, x * 2.0], axis=0).mean(axis=1)
    if kind == 5:
        return dx.reshape(x, (m, k, 1)).sum(axis=0)
    return dx.transpose(g) @ (x - x.mean(axis=0))


def reference(kind: int, x, g):
    m, k = x.shape
    return [lambda: x.T @ g, lambda: x.T @ x, lambda: x + np.tanh(x),
            lambda: (x[: m // 2] * 2.0).sum(axis=0),
            lambda: np.concatenate([x, x * 2.0]).mean(axis=1),
            lambda: x.reshape(m, k, 1).sum(axis=0),
            lambda: g.T @ (x - x.mean(axis=0))][kind]()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.integers(0, 6), m=st.integers(2, 700), k=st.integers(1, 24),
       n=st.integers(1, 9), memory=st.sampled_from(MEMORIES), seed=st.integers(0, 2**20),
       from_file=st.booleans())
def test_inlining_does_not_change_results(tmp_path, kind, m, k, n, memory, seed, from_file):
    rng = np.random.default_rng(seed)
    xv, gv = rng.standard_normal((m, k)), rng.standard_normal((m, n))
    if from_file:
        np.save(tmp_path / "x.npy", xv)
        x, inputs = dx.input("x", xv.shape, "float64"), {"x": str(tmp_path / "x.npy")}
    else:
        x = dx.random.normal((m, k), seed=seed, dtype="float64")
        inputs = {}
        xv = evaluate(x, 2**30)[0]
    g = dx.input("g", gv.shape, "float64")
    y = build(kind, x, g)
    if "g" in {n.id for n in dx.build_graph(y).inputs}:
        inputs["g"] = gv
    try:
        (inlined,) = evaluate(y, memory, inputs)
    except dx.PlanError:
        return
    (plain,) = evaluate(y, memory, inputs, inline=False)
    if not from_file and kind in (0, 1, 2, 6):
        # The plan's task count foresees the pass where the views are transposes (it counts
        # a slice, reshape or concat as tasks, and leaves a file input's reads out).
        plan, low = lowered(y, memory, inputs)
        assert plan.stats().tasks == len(low.dsk)
    want = reference(kind, xv, gv)
    scale = max(1.0, float(np.abs(want).max(initial=0.0))) * max(m, k)
    np.testing.assert_allclose(inlined, plain, rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(inlined, want, rtol=0, atol=1e-12 * scale)


def test_a_small_reduction_is_finished_inside_the_task_that_reads_it(tmp_path):
    # One chunk: each reduction's only partial is computed in its finish, and each finish
    # in the one task that adds them; what is left is the read (two readers) and that task.
    values = np.random.default_rng(3).standard_normal((300, 20))
    np.save(tmp_path / "x.npy", values)
    x = dx.input("x", values.shape, "float64")
    y = x.mean(axis=0) + x.max(axis=0)
    inputs = {"x": str(tmp_path / "x.npy")}
    plan, low = lowered(y, 2**30, inputs)
    assert plan.stats().tasks == len(low.dsk) == 2
    assert not any(".partial" in str(k[0]) for k in low.dsk)
    (got,) = evaluate(y, 2**30, inputs)
    (plain,) = evaluate(y, 2**30, inputs, inline=False)
    np.testing.assert_array_equal(got, plain)
    np.testing.assert_allclose(got, values.mean(axis=0) + values.max(axis=0), rtol=1e-14)
    # Many chunks: the partials stay tasks of their own (the reduction stays parallel).
    plan, low = lowered(x.sum(axis=0) * 2.0, 2**16, inputs)
    partials = [k for k in low.dsk if ".partial" in str(k[0])]
    assert len(partials) == math.prod(len(c) for c in plan.partition.spaces[
        next(n.id for n in plan.fused.nodes if n.op == "sum")]) > 1


@pytest.mark.parametrize("memory", MEMORIES[:3])
@pytest.mark.parametrize("rows", [20, 3000])
def test_sums_read_by_a_mean_are_finished_inside_it_as_the_plan_says(memory, rows):
    """A loss: per-row sums divided, then their mean. Each sum's result chunk is read by
    the one partial of the mean over that chunk, so it is finished inside it; the plan's
    task count says so too (it counted the sums' finishes as tasks of their own: the
    held-out loss of a training recorded 9 planned tasks and ran 7)."""
    rng = np.random.default_rng(rows)
    values = {"x": rng.standard_normal((rows, 5)), "w": rng.standard_normal((5, 2)),
              "y": rng.standard_normal((rows, 2))}
    x, w, y = (dx.input(k, v.shape, "float64") for k, v in values.items())
    logits = x @ w
    loss = (-(y * dx.log_softmax(logits, axis=1)).sum(axis=1)
            / dx.exp(logits).sum(axis=1)).mean()
    plan, low = lowered(loss, memory, values)
    assert plan.stats().tasks == len(low.dsk)
    (got,) = evaluate(loss, memory, values)
    z = values["x"] @ values["w"]
    log_softmax = z - z.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    want = (-(values["y"] * log_softmax).sum(axis=1) / np.exp(z).sum(axis=1)).mean()
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_reader_of_many_reduced_chunks_does_not_compute_them_all_itself():
    """A reshape after global pooling: the reshape task reads many chunks of a mean over
    the image axes, as results. Inlining every mean into it made that task depend on, and
    hold at once, all the image blocks they reduce (workers died of it). (A flatten that
    keeps the image axis is chunked as the mean is and reads one chunk a task: here eight
    images' features make a row.)"""
    values = np.random.default_rng(4).standard_normal((4096, 8, 8, 8)).astype(np.float32)
    weights = np.random.default_rng(5).standard_normal((64, 4)).astype(np.float32)
    x, w = dx.input("x", values.shape, "float32"), dx.input("w", weights.shape, "float32")
    pooled = dx.mean(dx.relu(x + 1.0), axis=(2, 3), keepdims=True)  # (4096, 8, 1, 1)
    out = dx.reshape(pooled, (512, 64)) @ w
    inputs = {"x": values, "w": weights}
    plan, low = lowered(out, 2**20, inputs)
    mean_id = next(n.id for n in plan.fused.nodes if n.op == "mean")
    reshape_id = next(n.id for n in plan.fused.nodes if n.op == "reshape")
    assert len(plan.partition.chunks[mean_id][0]) > len(plan.partition.chunks[reshape_id][0])
    from deepx_flow.compiler.taskspec import refs_of
    readers = [k for k in low.dsk if isinstance(k, tuple) and node_of(k[0]) == reshape_id]
    assert readers
    for key in readers:
        read = {node_of(r[0]) for r in refs_of(low.dsk[key])}
        assert read == {mean_id}, (key, read)  # not the image blocks the means reduce
    (got,) = evaluate(out, 2**20, inputs)
    want = np.maximum(values.astype(np.float64) + 1.0, 0).mean(axis=(2, 3)).reshape(512, 64) \
        @ weights
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_standardization_reads_and_decodes_each_stored_chunk_once(tmp_path, monkeypatch):
    """Three passes (the mean, the variance, the third moment) over a stored array read each
    of its chunks once, in tasks of their own that the passes share, as the plan says."""
    from deepx_flow.storage import readers
    data = np.random.default_rng(3).standard_normal((6000, 8)).astype("float32")
    store = zarr.create_array(tmp_path / "x.zarr", shape=data.shape, chunks=(500, 8),
                              dtype="float32")
    store[...] = data
    x = dx.read_zarr(str(tmp_path / "x.zarr"))
    centred = x - x.mean(axis=0)
    z = centred / dx.sqrt((centred * centred).mean(axis=0))
    third = (z * z * z).mean(axis=0)
    plan, low = lowered(third, 64 * 2**10)
    reads = [k for k in low.dsk if isinstance(k, tuple) and node_of(k[0]).startswith("read_zarr")]
    assert len(reads) == math.prod(len(c) for c in plan.partition.chunks[node_of(reads[0][0])])
    assert f"read and decoded once, its {len(reads)} chunk(s)" in plan.explain()
    assert "for 3 readers" in plan.explain()
    regions = []
    real = readers.read_region
    monkeypatch.setattr(readers, "read_region",
                        lambda path, region, *a, **k: regions.append(region) or
                        real(path, region, *a, **k))
    (got,) = evaluate(third, 64 * 2**10)
    assert len(regions) == len(reads) == len(set(map(repr, regions)))
    wide = data.astype(np.float64)
    zz = (wide - wide.mean(axis=0)) / wide.std(axis=0)
    np.testing.assert_allclose(got, (zz ** 3).mean(axis=0), atol=1e-5)
