"""Building new nodes inside a pass: the `Emitter` that gradient rules write with.

A pass that adds computation (`differentiate`) builds its nodes through an emitter, which
types each node by its operator's rule and gives it the content-hash id the SDK would give it
(`compiler.infer.new_node`). A node that already exists (in the graph, or made earlier) is
reused, so a rule that asks for `exp(y)` where the forward graph has it shares it. The
emitter remembers the nodes it made, in the order made, which is a topological order.

Rules call it as `e(op, *inputs, **attrs)` and use the helpers for constants, reductions to
a shape and broadcasts to one.
"""

from __future__ import annotations

from typing import Iterable

from deepx_flow.compiler.infer import new_node
from deepx_flow.errors import GraphError
from deepx_flow.ir import Node


class Emitter:
    """Makes typed nodes and remembers the new ones.

    Parameters
    ----------
    known : iterable of Node
        The nodes that exist already (the graph being extended).
    """

    def __init__(self, known: Iterable[Node]):
        self.nodes: dict[str, Node] = {n.id: n for n in known}
        self.new: list[Node] = []

    def __call__(self, op: str, *inputs: Node, shape=None, dtype=None, **attrs) -> Node:
        node = new_node(op, list(inputs), shape, dtype, **attrs)
        have = self.nodes.get(node.id)
        if have is None:
            self.nodes[node.id] = node
            self.new.append(node)
            return node
        if have != node:
            raise GraphError("a node the compiler builds has the id of a different node in "
                             "the graph; rename that input", node.id)
        return have

    def const(self, value, dtype: str) -> Node:
        """A 0-d constant of `dtype`, which broadcasts against anything."""
        return self("full", shape=(), dtype=dtype, value=value)

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Node:
        return self("full", shape=tuple(shape), dtype=dtype, value=0)

    def sum(self, x: Node, axes: Iterable[int], keepdims: bool = False) -> Node:
        return self("sum", x, axes=tuple(sorted(axes)), keepdims=bool(keepdims))

    def keep_dims(self, x: Node, shape: tuple[int, ...], axes: tuple[int, ...],
                  keepdims: bool) -> Node:
        """`x`, a reduction over `axes` of a tensor of `shape`, with the reduced axes kept
        as size 1 (so it broadcasts against the reduced tensor)."""
        if keepdims:
            return x
        kept = tuple(1 if a in axes else s for a, s in enumerate(shape))
        return x if x.shape == kept else self("reshape", x, shape=kept)

    def broadcast_to(self, x: Node, shape: tuple[int, ...]) -> Node:
        """`x` broadcast to `shape` as a tensor of its own (adding a zero of that shape)."""
        if x.shape == tuple(shape):
            return x
        return self("add", x, self.zeros(shape, x.dtype))

    def sum_to(self, x: Node, shape: tuple[int, ...]) -> Node:
        """`x` summed down to `shape`, which broadcasts to `x.shape`: the adjoint of
        broadcasting. Leading axes and axes of size 1 in `shape` are summed over."""
        shape = tuple(shape)
        if x.shape == shape:
            return x
        lead = x.ndim - len(shape)
        if lead < 0 or any(s not in (1, x.shape[lead + i]) for i, s in enumerate(shape)):
            return self.broadcast_to(x, shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                          if s == 1 and x.shape[lead + i] != 1)
        if axes:
            x = self.sum(x, axes, keepdims=True)
        return x if x.shape == shape else self("reshape", x, shape=shape)
