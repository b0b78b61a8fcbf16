"""The partitioner: every task fits the budget, aligned operands share grids, clear errors."""

import math

import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.chunking.classes import Classes, count, regular_chunks
from deepx_flow.compiler.partition import _balance, _even_out
from deepx_flow.config import Settings
from tests.helpers import cluster_with_memory


def plan_for(outputs, memory, **kw):
    return compile_graph(dx.build_graph(outputs), cluster_with_memory(memory, **kw), check=True)


def test_every_task_fits_the_budget_for_a_small_worker():
    x = dx.input("x", (3000, 700))
    w = dx.random.normal((700, 900), seed=0)
    y = dx.softmax(dx.gelu(x @ w + 1.0), axis=1).mean(axis=0)
    plan = plan_for(y, memory=64 * 2**20)
    stats = plan.stats()
    assert all(r.peak_working_set <= plan.partition.budget for r in stats.nodes)
    mm = plan.fused.nodes[2]
    assert mm.op == "matmul"
    # The matmul had to be tiled: more than one chunk along M.
    assert len(plan.chunks[mm.id][0]) > 1


def test_matmul_tiles_over_m_n_and_k_when_memory_is_tight():
    a = dx.random.normal((2048, 2048), seed=0, dtype="float64")
    b = dx.random.normal((2048, 2048), seed=1, dtype="float64")
    plan = plan_for(a @ b, memory=16 * 2**20)
    node = plan.fused.nodes[-1]
    assert len(plan.chunks[node.id][0]) > 1 and len(plan.chunks[node.id][1]) > 1
    assert len(plan.partition.k_chunks[node.id]) > 1


def test_elementwise_operands_share_the_result_grid():
    x = dx.input("x", (5000, 300))
    y = dx.input("y", (5000, 300))
    z = x * y + dx.exp(x)
    plan = plan_for(z, memory=8 * 2**20)
    assert plan.chunks["x"] == plan.chunks["y"] == plan.chunks[z.node.id]
    assert len(plan.chunks["x"][0]) > 1


def test_softmax_keeps_its_axis_whole():
    x = dx.input("x", (4000, 2500))
    plan = plan_for(dx.softmax(x, axis=1), memory=16 * 2**20)
    chunks = plan.chunks[plan.fused.nodes[-1].id]
    assert chunks[1] == (2500,) and len(chunks[0]) > 1


def test_softmaxes_along_different_axes_of_one_tensor_fit():
    x = dx.input("x", (64, 64), "float64")
    plan = plan_for([dx.softmax(x, 0), dx.softmax(x, 1)], memory=8000)
    assert all(r.peak_working_set <= plan.partition.budget for r in plan.stats().nodes)


def test_a_row_bigger_than_the_budget_fails_at_compile_time():
    x = dx.input("x", (10, 50_000_000))
    with pytest.raises(dx.PlanError, match=r"node 'softmax-.*cannot fit.*must stay whole"):
        plan_for(dx.softmax(x, axis=1), memory=64 * 2**20)


def test_large_tensors_are_split_for_parallelism():
    x = dx.input("x", (4_000_000, 16))
    plan = plan_for(dx.exp(x), memory=2**40, workers=2, threads=2)
    assert len(plan.chunks["x"][0]) >= 2 * 2 * Settings().chunks_per_thread


def test_a_matmul_by_small_weights_gets_every_thread_its_tasks_and_a_square_one_half():
    # Another tile of x @ w reads all of w again: nothing when w is a layer's weights, a
    # whole block when both operands are large.
    target = 2 * 2 * Settings().chunks_per_thread
    x = dx.input("x", (4_000_000, 256))
    layer = plan_for(x @ dx.input("w", (256, 256)), memory=2**40, workers=2, threads=2)
    assert len(layer.chunks["x"][0]) >= target
    a, b = dx.input("a", (8192, 8192)), dx.input("b", (8192, 8192))
    square = plan_for(a @ b, memory=2**40, workers=2, threads=2)
    node = square.fused.nodes[-1]
    tiles = math.prod(len(c) for c in square.chunks[node.id])
    assert 4 <= tiles < target


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 3000), k=st.integers(1, 700), n=st.integers(1, 900),
       memory=st.sampled_from([2**20, 4 * 2**20, 64 * 2**20, 2**34]))
def test_property_plans_fit_and_cover_the_shapes(m, k, n, memory):
    x = dx.input("x", (m, k))
    y = (dx.tanh(x @ dx.random.uniform((k, n), seed=3)) * 2.0).sum(axis=1, keepdims=True)
    try:
        plan = plan_for(y, memory=memory)
    except dx.PlanError:
        # Only acceptable when even the smallest tiles cannot fit.
        assert memory <= 4 * 2**20
        return
    for node in plan.fused.nodes:
        chunks = plan.chunks[node.id]
        assert tuple(sum(c) for c in chunks) == node.shape
        assert all(min(c) > 0 for c in chunks if sum(c) > 0)
    assert all(r.peak_working_set <= plan.partition.budget for r in plan.stats().nodes)


def test_explain_lists_tensors_tasks_and_ratio():
    x = dx.input("x", (200_000, 512))
    w = dx.random.normal((512, 1024), seed=0)
    y = dx.relu(x @ w + 1.0).sum(axis=1)
    text = dx.compile(y, cluster="graphs/clusters/8xH100.yaml").explain()
    assert "8xH100" in text and "chunk shape" in text and "peak working set" in text
    assert "compute/communication ratio" in text
    assert "matmul + relu(add(in0, 1.0))" in text
    stats = dx.compile(y, cluster="graphs/clusters/8xH100.yaml").stats()
    mm = stats.nodes[2]
    assert math.isclose(mm.flops, 2 * 200_000 * 512 * 1024 + 2 * 200_000 * 1024, rel_tol=1e-9)


def test_reshape_prefers_runs_of_whole_operand_rows():
    x = dx.input("x", (64, 2**20), "float32")
    plan = plan_for(x.reshape(-1), memory=32 * 2**20)  # one 4 MiB row per task fits
    assert plan.stats().nodes[-1].peak_working_set <= plan.partition.budget
    y = dx.input("y", (4, 3000), "float64")
    plan = plan_for((y * 2.0).reshape(12000), memory=200_000)
    assert len(plan.chunks[plan.fused.nodes[-1].id][0]) == 4  # one operand row each


def test_sources_read_only_through_slices_are_still_split_for_parallelism():
    r = dx.random.normal((8192, 4096), seed=0, dtype="float64")
    plan = plan_for(r[::2] * 2.0, memory=8 * 2**30, threads=4)
    assert len(plan.chunks[r.node.id][0]) > 1


def _stored(tmp_path, shape, chunks, name="a.zarr"):
    import zarr
    path = str(tmp_path / name)
    zarr.create_array(store=path, shape=shape, chunks=chunks, dtype="float32", zarr_format=3)
    return dx.read_zarr(path)


def test_stored_arrays_are_read_in_their_own_chunks(tmp_path):
    # Summed over its chunked axis: split along the stored chunks (partial sums), not
    # across the columns each stored chunk spans (which would read every chunk 4 times).
    x = _stored(tmp_path, (262_144, 1024), (65_536, 1024))
    assert x.node.attr("storage_chunks") == (65_536, 1024)
    plan = plan_for(x.sum(axis=0), memory=2**34, workers=2, threads=1)
    assert plan.chunks[x.node.id] == ((65_536,) * 4, (1024,))
    # Tight memory: chunk sizes stay multiples of the stored chunk while they can.
    y = _stored(tmp_path, (40_000, 64), (3000, 64), "b.zarr")
    plan = plan_for(dx.exp(y), memory=12 * 2**20, workers=1, threads=1)
    rows = plan.chunks[y.node.id][0]
    assert all(r % 3000 == 0 for r in rows[:-1]) and sum(rows) == 40_000
    assert all(r.peak_working_set <= plan.partition.budget for r in plan.stats().nodes)


def test_storage_chunks_survive_yaml_and_are_checked(tmp_path):
    x = _stored(tmp_path, (100, 8), (10, 8))
    back = dx.from_yaml(dx.to_yaml(x * 2.0))
    assert back == dx.build_graph(x * 2.0)
    bad = dx.to_yaml(x).replace("storage_chunks: [10, 8]", "storage_chunks: [-10, 8]")
    assert bad != dx.to_yaml(x)
    with pytest.raises(dx.GraphError, match="storage_chunks must be 2 positive integers"):
        dx.from_yaml(bad)


def test_parallelism_never_splits_below_a_stored_chunk(tmp_path):
    # 4 stored chunks for 2 x 2 threads wanting more tasks: still 4 reads, one per chunk.
    x = _stored(tmp_path, (4 * 65_536, 1024), (65_536, 1024))
    plan = plan_for(dx.exp(x).sum(axis=0), memory=2**34, workers=2, threads=2)
    assert plan.chunks[x.node.id][0] == (65_536,) * 4
    # Memory fitting still may: a budget below one stored chunk splits it.
    plan = plan_for(dx.exp(x), memory=2**28, workers=1, threads=1)
    assert max(plan.chunks[x.node.id][0]) < 65_536


def test_a_chain_of_thousands_of_concats_plans():
    # the largest chunk along a concat's axis was found by recursing through the concats it
    # joins: 3,000 of them overflowed Python's recursion limit. Each concat kept its pieces'
    # chunks, 4.5 million tasks in all; small pieces are now joined (`join_pieces`), and the
    # task count before the grids are built bounds each concat's chunks by what joining
    # leaves, so the plan has about one task a node.
    x = dx.input("x", (64, 2), "float64")
    z = x
    for i in range(3000):
        z = dx.concat([z, x[:, :1] * float(i)], axis=1)
    plan = plan_for(z, memory=2**30)
    chunks = plan.chunks[z.node.id]
    assert sum(chunks[1]) == 3002 and sum(chunks[0]) == 64
    assert all(r.peak_working_set <= plan.partition.budget for r in plan.stats().nodes)
    assert plan.stats().tasks <= 2 * len(plan.fused.nodes)


def test_nested_concats_along_two_axes_fit_a_small_budget():
    a = dx.input("a", (300, 40), "float64")
    row = a
    for i in range(5):
        row = dx.concat([row, a * float(i)], axis=1)        # (300, 240)
    block = dx.concat([row, row + 1.0, row * 2.0], axis=0)   # (900, 240)
    plan = plan_for(block, memory=2**20)
    assert all(r.peak_working_set <= plan.partition.budget for r in plan.stats().nodes)
    assert len(plan.chunks[block.node.id][0]) > 1


def test_measured_seconds_count_the_sources_a_task_reads_inside():
    # The registry measured "sum <- random_normal" with the normal draws' work in it: the
    # planner must count that work too, or it takes the tasks for 30x shorter than they are
    # and stops splitting them for parallelism.
    from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec
    from deepx_flow.registry.speeds import OperatorSpeed

    x = dx.random.normal((400_000, 64), seed=0)
    y = x.sum(axis=1)
    # Each worker does the whole tensor's work (draws and sum) in one second.
    rate = 400_000 * 64 * (30 + 1)
    speeds = {"sum <- random_normal": OperatorSpeed(rate, 1e9, 10)}
    cluster = ClusterSpec("measured", tuple(
        WorkerSpec(f"w{i}", "localhost", 2, 2**40, speeds=speeds) for i in range(2)))
    plan = compile_graph(dx.build_graph(y), cluster, check=True)
    # A task of 1/16 of the work takes 62 ms, over the 20 ms floor: the full 16 tasks.
    assert len(plan.chunks[plan.fused.nodes[0].id][0]) >= 2 * 2 * Settings().chunks_per_thread


def _finish(chunks, threads):
    """When the last of these task sizes ends, longest first to the least loaded thread."""
    loads = [0] * threads
    for c in sorted(chunks, reverse=True):
        loads[loads.index(min(loads))] += c
    return max(loads)


def test_chunks_rounded_to_stored_chunks_end_together(tmp_path):
    # 2,000 planes stored 62 at a time: halving rounded to stored chunks gives 186 (11
    # tasks, 6 on one of two threads); 248 makes 9 tasks that end together.
    x = _stored(tmp_path, (2000, 256, 256), (62, 256, 256))
    plan = plan_for(x.sum(axis=0), memory=2**34, workers=2, threads=1)
    planes = plan.chunks[x.node.id][0]
    assert all(p % 62 == 0 for p in planes[:-1])
    assert _finish(planes, 2) == min(_finish(regular_chunks(2000, s), 2)
                                     for s in range(max(planes), 2 * max(planes), 62))
    assert _finish(planes, 2) < _finish(regular_chunks(2000, 186), 2)


@settings(max_examples=60, deadline=None)
@given(stored=st.integers(1, 40), blocks=st.integers(2, 80), threads=st.integers(1, 8),
       part=st.integers(1, 39))
def test_balanced_chunks_finish_no_later_than_the_halved_ones(stored, blocks, threads, part):
    # Whatever the extent, stored chunk and thread count, the chosen grid ends no later than
    # plain halving rounded up to stored chunks would (the size the balance step starts at).
    extent = stored * (blocks - 1) + min(part, stored)
    classes = Classes()
    classes.add("a", extent)
    classes.prefer("a", stored)
    before = classes.chunk("a")
    while count(extent, classes.chunk("a")) < 4 * threads and classes.chunk("a") > stored:
        before = classes.chunk("a")
        classes.halve("a")
    halved = classes.chunk("a")
    _balance(classes, "a", before, ["a"], threads)
    chosen = classes.chunk("a")
    assert chosen % stored == 0 or chosen == halved
    assert halved <= chosen < max(before, halved + 1)
    assert _finish(regular_chunks(extent, chosen), threads) <= \
        _finish(regular_chunks(extent, halved), threads)


def test_a_grid_memory_cut_is_evened_out():
    # 1,000,000 images in stored chunks of 8,192, tasks of 65,536 fitting memory: 15 full
    # tasks and a small one, 8 rounds on one of 2 threads; 49,152 makes both end together.
    classes = Classes()
    classes.add("a", 1_000_000)
    classes.prefer("a", 8192)
    classes.size[classes.find("a")] = 65536
    _even_out(classes, "a", ["a"], 2)
    assert classes.chunk("a") == 49152
    assert _finish(regular_chunks(1_000_000, 49152), 2) < \
        _finish(regular_chunks(1_000_000, 65536), 2)


@settings(max_examples=60, deadline=None)
@given(stored=st.integers(1, 40), blocks=st.integers(2, 80), threads=st.integers(1, 8),
       part=st.integers(1, 39), fits=st.integers(1, 80))
def test_evened_out_chunks_are_no_larger_and_end_no_later(stored, blocks, threads, part,
                                                          fits):
    extent = stored * (blocks - 1) + min(part, stored)
    classes = Classes()
    classes.add("a", extent)
    classes.prefer("a", stored)
    size = min(fits, blocks) * stored
    classes.size[classes.find("a")] = size
    _even_out(classes, "a", ["a"], threads)
    chosen = classes.chunk("a")
    assert chosen == min(size, extent) or (chosen % stored == 0 and size // 2 < chosen < size)
    assert _finish(regular_chunks(extent, chosen), threads) <= \
        _finish(regular_chunks(extent, min(size, extent)), threads)
