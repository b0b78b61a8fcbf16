"""Graphs as clients send them: the graph spec's JSON form (a YAML spec is JSON's
superset, so the spec stays the one description of a graph), read into a checked Graph,
and analyzed: its inputs and outputs, and the plan this server's cluster would run.

Over gRPC the spec travels as JSON text (`graph_json`), never as protobuf's `Struct`, whose
numbers are all doubles: an integer literal of a node's arguments would arrive a float and
change the dtype it gives.
"""

from __future__ import annotations

import json

from deepx_flow.contract.tensors import datatype_of
from deepx_flow.errors import SpecError, shown


def spec_document(spec):
    """A spec as a parsed JSON object: as given, or read from JSON text."""
    if not isinstance(spec, (str, bytes)):
        return spec
    try:
        return json.loads(spec)
    except RecursionError:
        raise SpecError("the graph's JSON is nested too deep") from None
    except ValueError as err:  # JSONDecodeError, and bytes that are not UTF-8
        raise SpecError(f"the graph is not JSON: {err}") from None


def graph_of(spec, max_nodes: int):
    """The checked Graph of a spec: a parsed JSON object, or JSON text. A SpecError or
    GraphError (naming the node) for anything wrong with it, as the YAML reader gives."""
    from deepx_flow.spec.reader import document_to_graph
    spec = spec_document(spec)
    if isinstance(spec, dict):
        entries = sum(len(spec.get(k) or ()) for k in ("inputs", "nodes")
                      if isinstance(spec.get(k), (list, dict)))
        if entries > max_nodes:
            raise SpecError(f"the graph has {entries:,} inputs and nodes, over the limit of "
                            f"{max_nodes:,} (DEEPX_MAX_NODES)")
    elif spec is not None:
        raise SpecError(f"the graph is {shown(spec)}, not a spec object")
    return document_to_graph(spec)


def values(graph, ids) -> list[dict]:
    """Name, datatype and shape of the graph's nodes `ids` (pairs of name and node id)."""
    return [{"name": name, "datatype": datatype_of(graph[node_id].dtype),
             "shape": list(graph[node_id].shape)} for name, node_id in ids]


def analyze(graph, cluster) -> dict:
    """What AnalyzeGraph answers: the inputs a run needs, the outputs it gives, and the plan
    for `cluster` (a ClusterSpec), as `deepx-flow explain` prints it."""
    from deepx_flow.compiler.compile import compile_graph
    plan = compile_graph(graph, cluster)
    return {"inputs": values(graph, [(n.id, n.id) for n in graph.inputs]),
            "outputs": values(graph, graph.outputs), "plan": plan.explain(),
            "tasks": plan.stats().tasks, "nodes": len(graph)}
