"""A concat's chunks along its axis are its operands' chunks, runs of small ones joined into one
task (`partition.join_pieces`): a 5,000-way concat of rows was 5,000 tasks, each a scheduler
round trip, and finding each chunk's operand scanned all of them (quadratic lowering). Every
grid is checked against NumPy's concatenate, run in this process (Dask's synchronous
scheduler)."""

from __future__ import annotations

import itertools

import dask
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.chunking.layout import join_pieces
from deepx_flow.config import Settings
from deepx_flow.ir.keys import node_of
from deepx_flow.runtime.inputs import bind_inputs
from tests.helpers import cluster_with_memory


def computed(y, inputs: dict, config: Settings, memory: int = 2**30):
    """`y` computed from its lowered graph, and the plan."""
    plan = compile_graph(dx.build_graph(y), cluster_with_memory(memory), config, check=True)
    low = plan.lower(bind_inputs(plan.graph, inputs))
    (name, _), = plan.graph.outputs
    _, chunks = low.outputs[name]
    values = dask.get(low.dsk, low.output_keys(name))
    out = np.empty(tuple(sum(c) for c in chunks), dtype=plan.graph.nodes[-1].dtype)
    starts = [np.cumsum((0,) + c[:-1]) for c in chunks]
    for idx, value in zip(itertools.product(*(range(len(c)) for c in chunks)), values):
        out[tuple(slice(s[i], s[i] + n) for s, i, n in zip(starts, idx, value.shape))] = value
    return out, plan, low


@given(st.lists(st.integers(0, 9), min_size=1, max_size=30), st.integers(1, 20))
def test_joined_pieces_keep_the_boundaries_and_the_limit(pieces, limit):
    chunks = join_pieces(tuple(pieces), limit)
    assert sum(chunks) == sum(pieces)
    cuts = set(itertools.accumulate(pieces))
    assert set(itertools.accumulate(chunks)) <= cuts | {0}  # never inside a piece
    longest = max(pieces)
    assert all(c <= max(limit, longest) for c in chunks)
    assert all(c > 0 for c in chunks) or chunks == (0,)
    # As few chunks as the rule allows: no two neighbours fit together.
    assert all(a + b > limit for a, b in zip(chunks, chunks[1:]))


DTYPES = ("float64", "float32", "int32")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(DTYPES)), min_size=1,
                max_size=12),
       st.integers(0, 1), st.sampled_from([8, 64, 200, 4 * 2**20]), st.booleans(),
       st.integers(0, 2**16))
def test_a_concat_of_any_pieces_equals_numpy(parts, axis, min_chunk, sliced, seed):
    rng = np.random.default_rng(seed)
    other = 3
    operands, inputs, arrays = [], {}, []
    whole = rng.standard_normal((sum(n for n, _ in parts), other)) * 100
    if axis == 1:
        whole = whole.T.copy()
    if sliced:  # pieces of one input, as `dx.concat([x[i:i+1] ...])` makes
        x = dx.input("x", whole.shape, "float64")
        inputs["x"] = whole
    at = 0
    for i, (n, dtype) in enumerate(parts):
        region = [slice(None), slice(None)]
        region[axis] = slice(at, at + n)
        at += n
        if sliced:
            piece, value = x[tuple(region)], whole[tuple(region)]
            if dtype != "float64":
                piece, value = dx.cast(piece, dtype), value.astype(dtype)
        else:
            value = whole[tuple(region)].astype(dtype)
            piece = dx.input(f"x{i}", value.shape, dtype)
            inputs[f"x{i}"] = value
        operands.append(piece)
        arrays.append(value)
    y = dx.concat(operands, axis=axis)
    out, plan, _ = computed(y, inputs, Settings(min_chunk_bytes=min_chunk))
    expected = np.concatenate(arrays, axis=axis)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out.astype("float64"), expected.astype("float64"))
    along = plan.chunks[y.node.id][axis]
    assert sum(along) == expected.shape[axis]
    if min_chunk >= 4 * 2**20:  # everything here is far smaller: one chunk
        assert len(along) == 1


def test_a_concat_of_thousands_of_rows_is_a_few_tasks():
    n = 5000
    x = dx.input("x", (n, 8), "float64")
    y = dx.concat([x[i:i + 1] for i in range(n)])
    data = np.random.default_rng(0).standard_normal((n, 8))
    out, plan, low = computed(y, {"x": data}, Settings())
    np.testing.assert_array_equal(out, data)
    assert plan.chunks[y.node.id][0] == (n,)
    # The slices are views computed inside the concat's task: the input and the concat.
    assert {node_of(k[0]).split("-")[0] for k in low.dsk} == {"x", "concat"}
    assert len(low.dsk) == 2


def test_large_operands_keep_their_own_chunks():
    # Joining is for small pieces only: operands past `min_chunk_bytes` stay a task each, so
    # a concat of big tensors keeps its parallelism.
    a = dx.input("a", (1000, 100), "float64")
    b = dx.input("b", (1000, 100), "float64")
    y = dx.concat([a, b])
    plan = compile_graph(dx.build_graph(y), cluster_with_memory(2**30),
                         Settings(min_chunk_bytes=100_000))
    assert len(plan.chunks[y.node.id][0]) >= 2
    assert all(c <= 1000 for c in plan.chunks[y.node.id][0])


def test_a_small_budget_still_fits_a_concat_of_many_pieces():
    # Joined chunks are fitted to the task budget like any other: 400 rows of 800 bytes
    # joined into one chunk (its pieces, their copy and the result) would need about 1 MB,
    # far past a budget of 64 kB.
    x = dx.input("x", (400, 100), "float64")
    y = dx.concat([x[i:i + 1] for i in range(400)])
    data = np.arange(40_000, dtype="float64").reshape(400, 100)
    out, plan, _ = computed(y, {"x": data}, Settings(), memory=2**17)
    np.testing.assert_array_equal(out, data)
    assert len(plan.chunks[y.node.id][0]) > 1
    assert all(r.peak_working_set <= plan.partition.budget for r in plan.stats().nodes)
