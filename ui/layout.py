"""Where to draw the nodes of a graph: a layered layout, pure and without dependencies.

Data flows left to right. A node's layer is the length of the longest path reaching it
from a node without inputs, so every edge points right. Within a layer nodes are ordered
by the mean position of their inputs (a few sweeps of the barycenter heuristic), which
keeps most edges short and uncrossed; ties keep the order nodes were given in, so the
same graph always looks the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

SWEEPS = 4  # barycenter passes; a few settle graphs of the size people draw


@dataclass(frozen=True)
class Placed:
    """A node's layer (x) and its slot within the layer (y), both from 0."""

    node: Hashable
    layer: int
    slot: int


def layers(nodes: Sequence, edges: Iterable[tuple]) -> dict:
    """Node -> layer: 0 for nodes without inputs, else one more than its deepest input.
    Edges are (source, target); edges naming unknown nodes are refused."""
    known = set(nodes)
    inputs: dict = {n: [] for n in nodes}
    for source, target in edges:
        if source not in known or target not in known:
            raise ValueError(f"edge {source!r} -> {target!r} names a node not in the graph")
        inputs[target].append(source)
    layer: dict = {}
    for start in nodes:  # iterative depth-first, so deep graphs do not hit the recursion limit
        stack = [(start, False)]
        on_path: set = set()
        while stack:
            node, done = stack.pop()
            if node in layer:
                continue
            if done:
                on_path.discard(node)
                layer[node] = 1 + max((layer[i] for i in inputs[node]), default=-1)
                continue
            if node in on_path:
                raise ValueError(f"the graph has a cycle through {node!r}")
            on_path.add(node)
            stack.append((node, True))
            stack.extend((i, False) for i in inputs[node] if i not in layer)
    return layer


def layout(nodes: Sequence, edges: Iterable[tuple]) -> list[Placed]:
    """A `Placed` per node, in the order given."""
    edges = list(edges)
    layer = layers(nodes, edges)
    inputs: dict = {n: [] for n in nodes}
    for source, target in edges:
        inputs[target].append(source)
    order = {n: i for i, n in enumerate(nodes)}
    by_layer: dict[int, list] = {}
    for n in nodes:
        by_layer.setdefault(layer[n], []).append(n)
    slot = {n: i for members in by_layer.values() for i, n in enumerate(members)}
    for _ in range(SWEEPS):
        for depth in sorted(by_layer)[1:]:
            def centre(n):
                ins = inputs[n]
                return sum(slot[i] for i in ins) / len(ins) if ins else slot[n]
            by_layer[depth].sort(key=lambda n: (centre(n), order[n]))
            for i, n in enumerate(by_layer[depth]):
                slot[n] = i
    return [Placed(n, layer[n], slot[n]) for n in nodes]


def edge_lines(edges: Iterable[tuple], at: dict, box_width: float) -> dict:
    """Plotting columns of one line per edge (source, target), from the right side of the
    source's box to the left side of the target's; `at` maps a node to its (x, y)."""
    lines = {"xs": [], "ys": [], "source": [], "target": []}
    for src, dst in edges:
        (x0, y0), (x1, y1) = at[src], at[dst]
        lines["xs"].append([x0 + box_width / 2, x1 - box_width / 2])
        lines["ys"].append([y0, y1])
        lines["source"].append(src)
        lines["target"].append(dst)
    return lines
