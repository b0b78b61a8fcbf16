"""`dx.call(graph, x=tensor, ...)`: a graph (a spec read with `dx.from_yaml`, or any
`dx.Graph`) used as a function of tensors: its outputs, built over the tensors given for its
inputs, as if its nodes had been written in Python over them.

So a spec composes with SDK code and with other specs, and an asset can be defined by a
spec whose inputs are its upstream assets. The nodes made are the SDK's: the same
operators, attributes, shapes and dtypes as the graph's, typed as each is made, with the
SDK's content-hash ids (a spec's node ids are names its author chose).
"""

from __future__ import annotations

from deepx_flow.errors import InputError, shown
from deepx_flow.ir import Graph
from deepx_flow.sdk.tensor import Tensor, apply


def call(graph: Graph, inputs: dict | None = None, **named) -> dict[str, Tensor]:
    """The outputs (name -> Tensor) of `graph` over the tensors given for its inputs (by
    input name, as a dict or as keywords). Each must have the input's shape and dtype; a
    missing, unknown or mismatched one is an InputError naming it."""
    if not isinstance(graph, Graph):
        raise InputError(f"call takes a dx.Graph (dx.from_yaml reads one), not "
                         f"{type(graph).__name__}")
    given = {**(inputs or {}), **named}
    wanted = {node.id: node for node in graph.nodes if node.op == "input"}
    unknown = sorted(set(given) - set(wanted))
    missing = sorted(set(wanted) - set(given))
    if unknown or missing:
        raise InputError("; ".join(
            ([f"the graph has no input(s) {', '.join(map(shown, unknown))}"] if unknown
             else []) +
            ([f"input(s) {', '.join(map(shown, missing))} not given"] if missing else []))
            + f" (its inputs: {', '.join(map(shown, wanted)) or 'none'})")
    made: dict[str, Tensor] = {}
    for node in graph.nodes:
        if node.op == "input":
            tensor = given[node.id]
            if not isinstance(tensor, Tensor):
                raise InputError(f"input {shown(node.id)}: a Tensor, not "
                                 f"{type(tensor).__name__} (dx.input, dx.read_zarr, ...)")
            if tensor.shape != node.shape or tensor.dtype != node.dtype:
                raise InputError(f"input {shown(node.id)} is {node.dtype}{node.shape} in the "
                                 f"graph, given {tensor.dtype}{tensor.shape}")
            made[node.id] = tensor
            continue
        made[node.id] = apply(node.op, [made[i] for i in node.inputs], shape=node.shape,
                              dtype=node.dtype, **dict(node.attrs))
    return {name: made[node_id].named(name) for name, node_id in graph.outputs}
