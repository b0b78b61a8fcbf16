"""bfloat16 in exported models: computed in float32 (sums in float64), as deepx_flow does.

deepx_flow computes every operator on bfloat16 values in float32 and rounds its result to
bfloat16 once; sums and means add up in float64 (`kernels/bfloat16.py`). An exported model
that applied ONNX's bfloat16 operators directly would compute otherwise where a runtime has
them, and would not run where it lacks them (ONNX Runtime's CPU kernels have no bfloat16
Add, Relu or MatMul). So `widen_bfloat16` rewrites the graph before it is exported: an
operator with a bfloat16 operand or result reads its bfloat16 operands through Casts to
float32 (float64 for `sum`, `mean` and `cumsum`), computes there, and its bfloat16 result
is a Cast of that. Graph inputs, initializers, constants (`full`, `arange`), the graph's
own casts and its outputs keep their dtypes, so the model's signature is the graph's, and it
computes what deepx_flow computes, to the runtime's float32 arithmetic.
"""

from __future__ import annotations

from dataclasses import replace

from deepx_flow.compiler.infer import infer_node
from deepx_flow.ir import Graph, Node

# Operators that make or convert bfloat16 values themselves: kept as they are (a random
# source's values are an initializer, rounded once from float64 as the kernel rounds them).
KEPT = frozenset({"input", "full", "arange", "random_normal", "random_uniform", "cast"})
# Operators whose bfloat16 operands are widened to float64, the dtype sums add up in.
SUMS = frozenset({"sum", "mean", "cumsum"})


def widen_bfloat16(graph: Graph) -> Graph:
    """`graph` with every operator on bfloat16 computing in float32 or float64 (see the module
    docstring).

    Before: a typed graph as built (no compiled nodes). After: the same inputs and outputs
    (ids, shapes, dtypes); no node but a source or a cast reads or makes bfloat16. A graph
    without bfloat16 is returned as it is.
    """
    if not any(n.dtype == "bfloat16" for n in graph.nodes):
        return graph
    nodes: dict[str, Node] = {}

    def widened(src: str, work: str) -> str:
        """The id of `src` cast to `work`, added once however many nodes read it."""
        cast_id = f"{src}/as_{work}"
        if cast_id not in nodes:
            nodes[cast_id] = Node(cast_id, "cast", (src,), graph[src].shape, work)
        return cast_id

    for node in graph.nodes:
        reads = [graph[i].dtype == "bfloat16" for i in node.inputs]
        if node.op in KEPT or not (node.dtype == "bfloat16" or any(reads)):
            nodes[node.id] = node
            continue
        work = "float64" if node.op in SUMS else "float32"
        inputs = tuple(widened(i, work) if bf16 else i for i, bf16 in zip(node.inputs, reads))
        compute_id = f"{node.id}/in_{work}" if node.dtype == "bfloat16" else node.id
        computed = infer_node(replace(node, id=compute_id, inputs=inputs, dtype=None),
                              [nodes[i] for i in inputs])
        nodes[compute_id] = computed
        if compute_id != node.id:  # the bfloat16 result, rounded once
            nodes[node.id] = Node(node.id, "cast", (compute_id,), node.shape, "bfloat16")
    return graph.replace(nodes.values())
