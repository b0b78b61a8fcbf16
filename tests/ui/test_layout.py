"""The dashboard's graph layout: every edge points right, no two nodes share a place, and
the order within layers follows the inputs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.ui.layout import layers, layout


@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))
                          .filter(lambda e: e[0] < e[1]), max_size=3 * n))
    order = draw(st.permutations(range(n)))
    return list(order), edges


@settings(max_examples=200, deadline=None)
@given(dags())
def test_every_edge_points_right_and_each_place_is_taken_once(graph):
    nodes, edges = graph
    placed = layout(nodes, edges)
    assert [p.node for p in placed] == nodes
    at = {p.node: p for p in placed}
    for source, target in edges:
        assert at[source].layer < at[target].layer
    assert len({(p.layer, p.slot) for p in placed}) == len(nodes)
    # Layers start at 0 and slots fill each layer from 0 without gaps.
    for depth in {p.layer for p in placed}:
        slots = sorted(p.slot for p in placed if p.layer == depth)
        assert slots == list(range(len(slots)))
    # A node's layer is its longest path from a source.
    for p in placed:
        ins = [at[s].layer for s, t in edges if t == p.node]
        assert p.layer == (max(ins) + 1 if ins else 0)


def test_a_layer_is_ordered_by_where_its_inputs_are():
    # a, b feed d and c respectively: c (from b, below) must come after d (from a).
    placed = {p.node: p for p in layout(["a", "b", "c", "d"], [("b", "c"), ("a", "d")])}
    assert placed["d"].slot < placed["c"].slot


def test_the_same_graph_always_looks_the_same():
    nodes = [f"n{i}" for i in range(30)]
    edges = [(f"n{i}", f"n{j}") for i in range(30) for j in (2 * i + 1, 3 * i + 2) if j < 30]
    assert layout(nodes, edges) == layout(nodes, edges)


def test_a_deep_chain_does_not_hit_the_recursion_limit():
    nodes = list(range(5000))
    assert layers(nodes, [(i, i + 1) for i in range(4999)])[4999] == 4999


def test_cycles_and_unknown_nodes_are_refused():
    with pytest.raises(ValueError, match="cycle"):
        layers(["a", "b"], [("a", "b"), ("b", "a")])
    with pytest.raises(ValueError, match="'z' names a node not in the graph"):
        layers(["a"], [("a", "z")])
