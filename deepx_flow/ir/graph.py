"""Immutable graphs of nodes.

A graph is its nodes in topological order (every input before its users) and its named
outputs. Two graphs are equal when their nodes and outputs are equal, which is what the YAML
round trip promises.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deepx_flow.errors import GraphError
from deepx_flow.ir.node import Node


@dataclass(frozen=True, slots=True)
class Graph:
    """A tensor graph: nodes in topological order and `(output name, node id)` pairs."""

    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, str], ...]
    _index: dict = field(default=None, compare=False, repr=False, hash=False)

    def __post_init__(self):
        index = {}
        for node in self.nodes:
            if node.id in index:
                raise GraphError("two different nodes share this id", node.id)
            index[node.id] = node
        object.__setattr__(self, "_index", index)

    def __getitem__(self, node_id: str) -> Node:
        return self._index[node_id]

    def __contains__(self, node_id: str) -> bool:
        return node_id in self._index

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def output_ids(self) -> tuple[str, ...]:
        return tuple(node_id for _, node_id in self.outputs)

    @property
    def inputs(self) -> tuple[Node, ...]:
        """The `input` nodes: the data a run must be given."""
        return tuple(n for n in self.nodes if n.op == "input")

    def consumers(self) -> dict[str, list[str]]:
        """Map each node id to the ids of the nodes that use it (once per use)."""
        users: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for node in self.nodes:
            for src in node.inputs:
                users[src].append(node.id)
        return users

    def replace(self, nodes, outputs=None) -> "Graph":
        return Graph(tuple(nodes), self.outputs if outputs is None else tuple(outputs))


def too_many_nodes(what: str, max_nodes: int, count: int | None = None) -> GraphError:
    """The error for a graph past the node limit (`Settings.max_nodes`, DEEPX_MAX_NODES):
    `what` has `count` nodes (or more than `max_nodes`, when the count stopped there)."""
    held = f"has {count:,} nodes, more than" if count is not None else "has more nodes than"
    return GraphError(f"{what} {held} the {max_nodes:,} a graph may have "
                      f"(DEEPX_MAX_NODES={max_nodes}: raise it to compile larger graphs)")
