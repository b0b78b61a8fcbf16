"""`compiler/group_workers.py`: each worker's consecutive tasks as one task, by level."""

from __future__ import annotations

import operator

import numpy as np
from hypothesis import given, settings, strategies as st

from dask.local import get_sync

from deepx_flow.compiler.group_workers import GROUP_SUFFIX, group_by_worker
from deepx_flow.compiler.taskspec import ref, refs_of, task


def _chain_graph(reads: list[list[int]]) -> dict:
    """Task i adds 1 to the sum of the tasks it reads (task 0 reads nothing)."""
    dsk = {}
    for i, rs in enumerate(reads):
        key = ("t", i)
        dsk[key] = task(key, lambda *xs: sum(xs) + 1, *[ref(("t", r)) for r in rs])
    return dsk


@st.composite
def graphs(draw):
    n = draw(st.integers(2, 30))
    reads = [[]] + [sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3))))
                    for i in range(1, n)]
    workers = [draw(st.sampled_from("abc")) for _ in range(n)]
    pinned = {("t", i): w for i, w in enumerate(workers) if draw(st.booleans())}
    return reads, pinned


@settings(max_examples=60, deadline=None)
@given(graphs(), st.sampled_from([None, 2, 5]))
def test_grouped_graphs_compute_the_same_and_respect_their_workers(graph, budget):
    reads, pinned = graph
    dsk = _chain_graph(reads)
    keep = [("t", len(reads) - 1), ("t", 0)]
    grouped, where = group_by_worker(dsk, pinned, keep, "g",
                                     (lambda key: 1) if budget else None, budget)
    assert get_sync(grouped, keep) == get_sync(dsk, keep)
    # every key comes after what it reads (the order the scheduler is given)
    seen = set()
    for key, node in grouped.items():
        assert all(r in seen for r in refs_of(node) if r in grouped), key
        seen.add(key)
    # a pinned task runs on its worker, inside a group or alone
    for key, w in pinned.items():
        if key in grouped:
            assert where.get(key, w) == w
    for key in grouped:
        if key[0] == "g" + GROUP_SUFFIX:
            members = grouped[key].args[1].value
            assert len({pinned.get(m.key, where[key]) for m in members} - {where[key]}) == 0


def test_a_chain_on_one_worker_is_one_group_and_a_budget_cuts_it():
    reads = [[]] + [[i - 1] for i in range(1, 10)]
    dsk = _chain_graph(reads)
    pinned = {("t", 0): "a"}
    grouped, where = group_by_worker(dsk, pinned, [("t", 9)], "g")
    groups = [k for k in grouped if k[0] == "g" + GROUP_SUFFIX]
    assert len(groups) == 1 and where[groups[0]] == "a"
    assert get_sync(grouped, [("t", 9)]) == (10,)
    cut, _ = group_by_worker(dsk, pinned, [("t", 9)], "g", lambda key: 1, 4)
    assert len([k for k in cut if k[0] == "g" + GROUP_SUFFIX]) == 5  # 2 tasks (4 bytes) each
    assert get_sync(cut, [("t", 9)]) == (10,)


def test_a_value_read_by_another_worker_is_taken_out_alone():
    # a -> b (other worker) -> a: three levels; b reads only the value it needs
    dsk = {("x", 0): task(("x", 0), lambda: np.ones(3)),
           ("x", 1): task(("x", 1), lambda v: v * 2, ref(("x", 0))),
           ("y", 0): task(("y", 0), operator.add, ref(("x", 1)), ref(("x", 0))),
           ("z", 0): task(("z", 0), lambda v: v.sum(), ref(("y", 0)))}
    pinned = {("x", 0): "a", ("x", 1): "a", ("y", 0): "b", ("z", 0): "a"}
    grouped, where = group_by_worker(dsk, pinned, [("z", 0)], "g")
    assert get_sync(grouped, [("z", 0)]) == (9.0,)
    assert where[("x", 1)] == "a" and ("x", 1) in grouped  # taken out for "b"
    assert all(r[0] != "g" + GROUP_SUFFIX for r in refs_of(grouped[("y", 0)]))
