"""Collect the graph behind a set of output tensors.

`build_graph` walks back from the outputs (iteratively, so deep chains do not hit Python's
recursion limit) and returns a `Graph` with nodes in topological order and named outputs. A
graph of more than `Settings.max_nodes` nodes (DEEPX_MAX_NODES) is refused as the walk
reaches that many, before any of the work it would take to compile.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

from deepx_flow.config import settings
from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import Graph, Node
from deepx_flow.ir.graph import too_many_nodes
from deepx_flow.sdk.tensor import Tensor

Outputs = Union[Tensor, Sequence[Tensor], Mapping[str, Tensor], Graph]


def output_pairs(outputs: Outputs) -> list[tuple[str, Tensor]]:
    """Name each output: dict keys, else the tensor's name, else `out0`, `out1`, ...

    A list may ask for one tensor several times (`[x, x]`): the first keeps the tensor's
    name and the others are named by position (`out1`), as unnamed tensors are. Two different
    tensors of one name stay an error (the validator's "output name ... is used twice").
    Raises GraphError for anything else (a number, None, a string, an array), and for a
    list or dict entry that is not a Tensor, naming it.
    """
    if isinstance(outputs, Tensor):
        return [(outputs.name or "out0", outputs)]
    if isinstance(outputs, Mapping):
        pairs = list(outputs.items())
    elif isinstance(outputs, (list, tuple)):
        pairs = _list_names(list(outputs))
    else:
        raise GraphError(f"outputs must be a dx.Tensor, a list or dict of them, or a Graph; "
                         f"got a {type(outputs).__name__}")
    for name, t in pairs:
        if not isinstance(name, str) or not name:
            raise GraphError(f"output names must be non-empty strings, got {shown(name)}")
        if not isinstance(t, Tensor):
            raise GraphError(f"output {shown(name)} is a {type(t).__name__}, not a dx.Tensor")
    return pairs


def _list_names(tensors: list) -> list[tuple[str, object]]:
    """`(name, tensor)` for each list item; see `output_pairs`."""
    first: dict[str, str | None] = {}  # a name -> the node of the first tensor listed with it
    names: list[str | None] = []
    for t in tensors:
        name = getattr(t, "name", None)
        node = getattr(getattr(t, "node", None), "id", None)
        if name and name in first and first[name] == node:
            names.append(None)  # the same tensor again: named by its position below
        else:
            names.append(name)  # a different tensor of a name already used: validate says so
            if name:
                first.setdefault(name, node)
    taken = {n for n in names if n}
    pairs = []
    for i, (name, t) in enumerate(zip(names, tensors)):
        if name is None:
            name, k = f"out{i}", 1
            while name in taken:  # a tensor may itself be named `out1`
                name, k = f"out{i}_{k}", k + 1
            taken.add(name)
        pairs.append((name, t))
    return pairs


def build_graph(outputs: Outputs) -> Graph:
    """The graph that computes `outputs` (a tensor, a list or dict of tensors, or a graph)."""
    if isinstance(outputs, Graph):
        return outputs
    pairs = output_pairs(outputs)
    max_nodes = settings().max_nodes
    order: list[Node] = []
    seen: dict[str, Node] = {}
    for _, root in pairs:
        stack: list[tuple[Tensor, bool]] = [(root, False)]
        while stack:
            tensor, expanded = stack.pop()
            node = tensor.node
            if node.id in seen:
                if seen[node.id] != node:
                    raise GraphError("two different tensors share this name; give each "
                                     "input a unique name", node.id)
                continue
            if expanded:
                seen[node.id] = node
                order.append(node)
                if len(order) > max_nodes:
                    raise too_many_nodes(f"the graph behind {shown(pairs[0][0])}", max_nodes)
                continue
            stack.append((tensor, True))
            for parent in reversed(tensor.parents):
                if parent.node.id not in seen:
                    stack.append((parent, False))
    return Graph(tuple(order), tuple((name, t.node.id) for name, t in pairs))


def tensors_of(graph: Graph, roots: Sequence[Tensor]) -> dict[str, Tensor]:
    """A Tensor for every node of `graph` (node id -> Tensor): the tensors behind `roots`
    as they are (their names kept), and new ones, linked to their operands, for the nodes
    a pass added."""
    out: dict[str, Tensor] = {}
    stack = list(roots)
    while stack:
        t = stack.pop()
        if t.node.id not in out:
            out[t.node.id] = t
            stack.extend(t.parents)
    for node in graph.nodes:
        if node.id not in out:
            out[node.id] = Tensor(node, tuple(out[i] for i in node.inputs))
    return out
