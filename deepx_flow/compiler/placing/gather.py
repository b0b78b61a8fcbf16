"""Pass: sharded parameters kept in pieces, the step's arithmetic left as it was.

Before: a training step's graph (`train.step`) and the inputs placed sharded: parameters and
their optimizer state, each to be kept in pieces along an axis (`splits`).
After: the same step, where the forward and backward passes read each sharded parameter
through a regrid, and its update (the elementwise nodes of its shape from its gradient and
state to the outputs `new_<input>`) reads what it needs from outside (the gradient) through
another. A regrid is a `slice` of the whole tensor: it sets no grid (`chunking/layout.py`),
so each side is chunked on its own. The partitioner then cuts the update into the pieces of
the parameter (its tasks run where the pieces live) while the passes chunk the parameter as
they would anyway: a task that uses it whole gathers its pieces, and the pieces of its
gradient are cut from the gradient's chunks, as ZeRO-3 gathers and reduce-scatters.

(A parameter placed tensor parallel is split in the arithmetic itself: its pieces' axis is
chunked alike through the matmuls that read it, so it needs no regrid.)
"""

from __future__ import annotations

from deepx_flow.compiler.infer import new_node
from deepx_flow.ir import Graph, Node
from deepx_flow.ops.registry import get_op
from deepx_flow.ops.spec import ELEMENTWISE


def gathered_where_used(graph: Graph, sharded: set[str]) -> Graph:
    """`graph` with the inputs in `sharded` regridded from their uses, and the updates that
    make their `new_<input>` outputs regridded from what they read (see above)."""
    if not sharded:
        return graph
    outputs = dict(graph.outputs)
    update = _update_nodes(graph, [outputs["new_" + i] for i in sorted(sharded)
                                   if "new_" + i in outputs])
    regrids: dict[str, Node] = {}  # node id -> its regrid

    def regrid(node: Node) -> str:
        if node.id not in regrids:
            regrids[node.id] = new_node("slice", [node], starts=(0,) * node.ndim,
                                        stops=tuple(node.shape), steps=(1,) * node.ndim)
        return regrids[node.id].id

    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = []
        for i in node.inputs:
            source = graph[i]
            if node.id in update:  # the update reads its gradient through a regrid
                crosses = i not in update and i not in sharded and source.ndim > 0
            else:  # the passes read a sharded parameter through one
                crosses = i in sharded
            inputs.append(regrid(source) if crosses else i)
        nodes.append(node if tuple(inputs) == node.inputs else
                     Node(node.id, node.op, tuple(inputs), node.shape, node.dtype, node.attrs))
    by_id = {r.id: r for r in regrids.values()}
    placed: list[Node] = []
    for node in nodes:  # each regrid right before its first reader
        placed += [by_id.pop(i) for i in node.inputs if i in by_id]
        placed.append(node)
    return graph.replace(placed)


def update_and_gradients(graph: Graph, inputs) -> set[str]:
    """The update nodes of `inputs` (parameters, state) and what they read from outside
    (the gradients): what a placement keeps or holds for a moment, not the step's own
    live values."""
    outputs = dict(graph.outputs)
    update = _update_nodes(graph, [outputs["new_" + i] for i in inputs
                                   if "new_" + i in outputs])
    return update | {i for n in update for i in graph[n].inputs if graph[i].ndim > 0}


def _update_nodes(graph: Graph, ends: list[str]) -> set[str]:
    """The elementwise nodes of each end's shape that the ends are computed from, back to
    the first node that is not one (a gradient's matmul or sum, an input)."""
    found: set[str] = set()
    for end in ends:
        shape = graph[end].shape
        stack = [end]
        while stack:
            node = graph[stack.pop()]
            if node.id in found or node.shape != shape or not node.inputs or \
                    get_op(node.op).kind != ELEMENTWISE:
                continue
            found.add(node.id)
            stack.extend(node.inputs)
    return found
