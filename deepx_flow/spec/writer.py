"""Writing a graph as a spec: the graph-level half of `yaml_io.py`, which needs no tensors.

The run recorder writes every recorded run's graph with it (`runtime/recording.py`), and the
gateway's client and the serving packager send or store graphs as spec documents, so it sits
below the SDK: `yaml_io.to_yaml` collects tensors into a graph and writes it here.
"""

from __future__ import annotations

from typing import Any

import yaml

from deepx_flow.ir import Graph, Node
from deepx_flow.ir.node import make_attrs, make_id
from deepx_flow.spec.normalize import is_literal, literal_dtype

VERSION = 1  # the spec format's version, `deepx:` (the reader refuses any other)
# libyaml's emitter where PyYAML has it: the same text as PyYAML's own emitter, four times
# sooner (a 20,000-node graph is written in 2 s instead of 8; every recorded run writes its
# graph).
_DUMPER = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper


def graph_yaml(graph: Graph, name: str | None = None, description: str | None = None) -> str:
    """The spec of `graph` as YAML text."""
    return yaml.dump(graph_to_document(graph, name=name, description=description),
                     Dumper=_DUMPER, sort_keys=False, default_flow_style=None, width=100,
                     allow_unicode=True)


def graph_to_document(graph: Graph, name: str | None = None,
                      description: str | None = None) -> dict[str, Any]:
    """The spec of `graph` as plain dicts and lists, ready for any YAML (or JSON) writer."""
    inline = inlined_constants(graph)
    doc: dict[str, Any] = {"deepx": VERSION}
    if name is not None:
        doc["name"] = name
    if description is not None:
        doc["description"] = description
    inputs: dict[str, Any] = {}
    nodes: list[dict[str, Any]] = []
    for node in graph.nodes:
        if node.op == "input":
            inputs[node.id] = _typed({}, node)
        elif node.id not in inline:
            nodes.append(_node_entry(node, graph, inline))
    if inputs:
        doc["inputs"] = inputs
    if nodes:
        doc["nodes"] = nodes
    doc["outputs"] = [node_id if out == node_id else {out: node_id}
                      for out, node_id in graph.outputs]
    return doc


def inlined_constants(graph: Graph) -> set[str]:
    """Ids of the constants that can be written as literals in their users' args.

    A constant qualifies when it is a 0-d `full` node with the SDK's content-hash id, is used
    and is not an output, and at every use the reader's typing rule (`normalize.literal_dtype`)
    gives back its dtype. Whether one use qualifies depends on which other operands are literals, so
    constants are dropped from the candidates until none changes.
    """
    users: dict[str, list[tuple[Node, int]]] = {n.id: [] for n in graph.nodes}
    for node in graph.nodes:
        for position, src in enumerate(node.inputs):
            users[src].append((node, position))
    outputs = set(graph.output_ids)
    # An unused constant has no args to be written into: it stays a node.
    candidates = {n.id for n in graph.nodes if _is_literal_constant(n) and users[n.id]
                  and n.id not in outputs}
    changed = True
    while changed:
        changed = False
        for node_id in sorted(candidates):
            constant = graph[node_id]
            for user, position in users[node_id]:
                arg_dtypes = [None if src in candidates else graph[src].dtype
                              for src in user.inputs]
                if literal_dtype(constant.attr("value"), position, user.op,
                                 arg_dtypes) != constant.dtype:
                    candidates.discard(node_id)
                    changed = True
                    break
    return candidates


def _is_literal_constant(node: Node) -> bool:
    if node.op != "full" or node.shape != () or node.inputs or node.dtype is None:
        return False
    value = node.attr("value")
    return (is_literal(value) and node.attrs == make_attrs(value=value)
            and node.id == make_id("full", (), (), node.dtype, node.attrs))


def _node_entry(node: Node, graph: Graph, inline: set[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": node.id, "op": node.op}
    if node.inputs:
        entry["args"] = [graph[src].attr("value") if src in inline else src
                         for src in node.inputs]
    _typed(entry, node)
    if node.attrs:
        entry["attrs"] = {key: _thaw(value) for key, value in node.attrs}
    return entry


def _typed(entry: dict[str, Any], node: Node) -> dict[str, Any]:
    # A node without a shape or dtype (a graph not yet typed) is written without it: the
    # reader derives it, so the spec stays valid.
    if node.shape is not None:
        entry["shape"] = list(node.shape)
    if node.dtype is not None:
        entry["dtype"] = node.dtype
    return entry


def _thaw(value: Any) -> Any:
    """Tuples (frozen attribute values) as lists, which every YAML library reads."""
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value
