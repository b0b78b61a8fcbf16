"""Pass: check that a graph is well formed before anything reads it.

Before: any `Graph` value (for example one read from YAML).
After: the same graph, known to have every input defined before its user, only known
operators with the right number of inputs and only their attributes, and outputs that name
nodes. Raises GraphError naming the first bad node.
"""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import Graph
from deepx_flow.ops import get_op


def validate_graph(graph: Graph) -> Graph:
    """Check structure (order, operators, arity, attributes, outputs); return the graph."""
    seen: set[str] = set()
    for node in graph.nodes:
        spec = get_op(node.op, node.id)
        spec.check_arity(node)
        for src in node.inputs:
            if src not in seen:
                why = "is not defined" if src not in graph else "is defined after it (cycle?)"
                raise GraphError(f"input {shown(src)} {why}", node.id)
        seen.add(node.id)
    if not graph.outputs:
        raise GraphError("the graph has no outputs")
    names = set()
    for name, node_id in graph.outputs:
        if node_id not in seen:
            raise GraphError(f"output {shown(name)} names node {shown(node_id)}, which is not "
                             "in the graph")
        if name in names:
            raise GraphError(f"output name {shown(name)} is used twice")
        names.add(name)
    return graph
