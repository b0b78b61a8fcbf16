"""Pass: work out every node's shape and dtype from its operator's type rule.

Before: a validated graph; nodes may leave shape and dtype as None where the operator derives
them (a YAML spec need not repeat them).
After: every node has its shape and dtype; where a node stated a derived shape or dtype, it
agreed with the rule (otherwise GraphError names the node and both values). Every shape has at
most 64 dimensions and fewer than 2**63 elements (`ops.common.check_bounds`). Node ids are
kept.
"""

from __future__ import annotations

from dataclasses import replace

from deepx_flow.errors import GraphError
from deepx_flow.ir import Graph, Node
from deepx_flow.ir.node import make_attrs, make_id
from deepx_flow.ops import get_op
from deepx_flow.ops.common import check_bounds


def infer_node(node: Node, inputs: list[Node]) -> Node:
    """Return `node` with its shape and dtype set from its operator's rule."""
    spec = get_op(node.op, node.id)
    shape, dtype = spec.infer(node, inputs)
    # Each rule bounds what it builds; this holds for every operator, whatever its rule.
    check_bounds(node, shape)
    if "shape" not in spec.declared and node.shape is not None and tuple(node.shape) != shape:
        raise GraphError(f"{node.op} gives shape {shape}, but the node states "
                         f"{tuple(node.shape)}", node.id)
    if "dtype" not in spec.declared and node.dtype is not None and node.dtype != dtype:
        raise GraphError(f"{node.op} gives dtype {dtype}, but the node states {node.dtype}",
                         node.id)
    if node.shape == shape and node.dtype == dtype:
        return node
    return replace(node, shape=shape, dtype=dtype)


def new_node(op: str, inputs: list[Node], shape=None, dtype=None, **attrs) -> Node:
    """A typed node of `op` over `inputs`, with its content-hash id: the node the SDK and the
    passes that build nodes (`differentiate`) make for the same computation, so building it
    twice, in any process, gives one node. Raises GraphError from the operator's rule."""
    spec = get_op(op)
    frozen = make_attrs(**attrs)
    in_ids = tuple(t.id for t in inputs)
    draft = Node(f"new {op}", op, in_ids, None if shape is None else tuple(shape), dtype, frozen)
    spec.check_arity(draft)
    typed = infer_node(draft, list(inputs))
    return Node(make_id(op, in_ids, typed.shape, typed.dtype, frozen), op, in_ids, typed.shape,
                typed.dtype, frozen)


def infer_types(graph: Graph) -> Graph:
    """Fill in (and check) the shape and dtype of every node; see the module docstring."""
    done: dict[str, Node] = {}
    for node in graph.nodes:
        done[node.id] = infer_node(node, [done[i] for i in node.inputs])
    return graph.replace(done.values())
