"""What a rule says about one kind of node, and the state the rules and the driver share.

The partitioner (`compiler/partition.py`) walks the graph and asks each node's rule; every
difference between kinds of operator is a rule's method, so the walk has none. A rule's
defaults are those of a node whose tasks each compute one chunk of its result, chunked as
its own classes of axes say; the kinds override what differs.
"""

from __future__ import annotations

import math

from deepx_flow.compiler.chunking.classes import Classes, count, regular_chunks
from deepx_flow.compiler.costs import TaskCost, main_cost
from deepx_flow.config import Settings
from deepx_flow.ir import Graph, Node, dtypes


class Chunking:
    """The graph being partitioned, its classes of axes and the rule of each node."""

    def __init__(self, graph: Graph, config: Settings, rules: dict, budget: int):
        self.graph, self.config, self.rules, self.budget = graph, config, rules, budget
        self.classes = Classes()
        # index space -> its shape (a matmul's K, the operand a reduction reduces)
        self.spaces: dict[str, tuple[int, ...]] = {}
        self._memo: dict[str, dict] = {}
        self._memo_at = -1

    def inputs(self, node: Node) -> list[Node]:
        return [self.graph[i] for i in node.inputs]

    def chunk(self, key) -> int:
        return self.classes.chunk(key)

    def chunk_of(self, node_id: str) -> tuple[int, ...]:
        """A chunk of the node's result, as its rule sizes it."""
        node = self.graph[node_id]
        return self.rules[node_id].chunk_of(node, self)

    def space_keys(self, space: str) -> list:
        return [(space, a) for a in range(len(self.spaces[space]))]

    def space_chunk(self, space: str) -> tuple[int, ...]:
        return tuple(self.chunk(k) for k in self.space_keys(space))

    def memo(self, name: str) -> dict:
        """A cache of the rule `name`, emptied whenever a chunk size changes."""
        if self._memo_at != self.classes.halvings:
            self._memo.clear()
            self._memo_at = self.classes.halvings
        return self._memo.setdefault(name, {})


class Rule:
    """How one kind of node is chunked (the defaults: see the module docstring)."""

    # whether the node joins its operands' axes with its own, so that it sets their grid
    sets_grid = True
    # whether the node's grid follows its users' where they set it (a source's)
    follows_users = False
    # whether the node keeps an axis whole that the driver may leave unjoined with its
    # operand's, when joining it cannot fit (softmax's)
    frees_whole_axis = False

    def spaces(self, node: Node, inputs: list[Node]) -> dict[str, tuple[int, ...]]:
        """Index spaces of the node's tasks besides its result, by name -> shape."""
        return {}

    def join(self, node: Node, inputs: list[Node], s: Chunking, join_whole_axes: bool) -> None:
        """Join the axes chunked alike, mark the axes kept whole and the sizes preferred."""

    def stored_chunks(self, node: Node) -> tuple[int, ...] | None:
        """The chunks of the stored array the node reads, if it reads one."""
        return None

    def chunk_of(self, node: Node, s: Chunking) -> tuple[int, ...]:
        return tuple(s.chunk((node.id, a)) for a in range(node.ndim))

    def task_keys(self, node: Node, s: Chunking) -> list:
        """The class keys whose chunk sizes set the working set of the node's task."""
        return [(node.id, a) for a in range(node.ndim)]

    def grid_keys(self, node: Node, s: Chunking) -> list:
        """The keys split to give the cluster's threads work."""
        return [(node.id, a) for a in range(node.ndim)]

    def cost(self, node: Node, inputs: list[Node], s: Chunking) -> TaskCost:
        """The cost of one of the node's main tasks at the current chunk sizes."""
        return main_cost(node, inputs, s.chunk_of)

    def peak(self, node: Node, inputs: list[Node], s: Chunking) -> int:
        """The most memory one of the node's tasks holds."""
        return self.cost(node, inputs, s).working_set

    def split_last(self, node: Node) -> list:
        """Keys split, for memory or parallelism, only when nothing else is left."""
        return []

    def summed(self, node: Node) -> list:
        """Keys of axes the node sums over: each split adds a partial result to move."""
        return []

    def wanted_tasks(self, node: Node, s: Chunking, target: int, threads: int) -> int:
        """How many tasks the node should have for the cluster's threads."""
        return target

    def partial_bytes(self, node: Node, cost: TaskCost, s: Chunking) -> int | None:
        """Bytes of one partial result a split of a summed axis adds (None: none)."""
        return None

    def chunk_counts(self, node: Node, s: Chunking, counts: dict) -> tuple[int, ...]:
        """How many chunks the result has along each axis (`counts`: the operands')."""
        return tuple(count(e, s.chunk((node.id, a))) for a, e in enumerate(node.shape))

    def tasks(self, node: Node, s: Chunking, counts: dict, fanin: dict) -> int:
        """How many tasks the node has (a combining node records its fan-in in `fanin`)."""
        return math.prod(counts[node.id])

    def task_count(self, n_main: int, n_out: int, fanin: int, along: int = 1) -> int:
        """Tasks of `n_main` main tasks making `n_out` result chunks (`plan.stats`)."""
        return n_main

    def chunks(self, node: Node, s: Chunking, chunks: dict) -> tuple[tuple[int, ...], ...]:
        """The result's chunks (`chunks`: the operands')."""
        return tuple(regular_chunks(e, s.chunk((node.id, a))) for a, e in enumerate(node.shape))

    def planned(self, node: Node, s: Chunking) -> dict[str, tuple]:
        """What else the plan keeps of the node: `spaces` (a reduction's operand space's
        chunks) or `k_chunks` (a matmul's K chunks)."""
        return {}


def nbytes(shape, dtype) -> int:
    return math.prod(shape) * dtypes.itemsize(dtype)


def fanin_for(partial_bytes: int, s: Chunking) -> int:
    """The widest tree-reduction step that fits the budget (at least 2)."""
    fits = s.budget // max(1, partial_bytes) - 1
    return max(2, min(s.config.reduce_fanin, fits))
