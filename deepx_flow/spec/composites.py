"""Composite operators written in a spec (`op: argmax`, `op: leaky_relu`, ...), expanded into
the primitives their Python function builds.

A composite is a function of primitives (the operator table, `ops/operators.yaml`, names
it). A program in another language writes it by name, as Python calls it, and the reader
expands it here, by calling that very function on the node's operands: so every language
has Python's functions, computing what Python's compute, and no expansion is written twice.
The nodes it makes keep the content-hash ids the SDK gives them, but for the last, which
takes the spec node's id (the name the spec's author gave the result).
"""

from __future__ import annotations

from typing import Any

from deepx_flow.errors import DeepxError, GraphError, closest, shown
from deepx_flow.ir import Node
from deepx_flow.ops.table import Operator, operator_table
from deepx_flow.sdk.tensor import Tensor


def composites() -> dict[str, Operator]:
    """The composite operators by name (those of DEEPX_EXTRA_OPERATORS too)."""
    return {n: op for n, op in operator_table().items() if op.kind == "composite"}


def check_attrs(op: Operator, attrs: dict[str, Any], node_id: str) -> None:
    """Each attribute is the composite's, and each required one is given."""
    known = [a.name for a in op.attrs]
    for key in attrs:
        if key not in known:  # (said as a primitive's is, `OpSpec.check_arity`)
            close = closest(key, known)
            hint = f"; did you mean {close!r}?" if close is not None else ""
            raise GraphError(f"{op.name} has no attribute {shown(key)} (allowed: "
                             f"{', '.join(known) or 'none'}){hint}", node_id)
    for attr in op.attrs:
        if attr.required and attrs.get(attr.name) is None:
            raise GraphError(f"{op.name} needs attribute {shown(attr.name)}", node_id)


def expand(op: Operator, node_id: str, operands: list[Node], attrs: dict[str, Any],
           shape, dtype) -> list[Node]:
    """The nodes computing composite `op` of `operands` (typed): those its function made,
    operands first, the last with id `node_id`. A stated `shape` or `dtype` is passed to a
    composite that states them, and checked against the result of any other."""
    from deepx_flow.sdk.build import build_graph
    names = _operand_names(op, len(operands), node_id)
    kwargs: dict[str, Any] = {n: Tensor(node) for n, node in zip(names, operands)}
    kwargs.update({k: v for k, v in attrs.items() if v is not None})
    stated = {s.name for s in op.states}
    for field, value in (("shape", shape), ("dtype", dtype)):
        if value is not None and field in stated:
            kwargs[field] = tuple(value) if field == "shape" else value
        elif value is None and field in stated and op.state(field).required:
            raise GraphError(f"{op.name} needs a declared {field}", node_id)  # (as `full`)
    function = _function(op)
    try:
        result = function(**kwargs)
    except Exception as err:  # its refusal, or a value it cannot take: said, never raw
        message = str(err) if isinstance(err, DeepxError) else f"{type(err).__name__}: {err}"
        raise GraphError(message if message.startswith(op.name) else
                         f"{op.name}: {message}", node_id) from None
    if not isinstance(result, Tensor):
        raise GraphError(f"{op.name}: its function {op.python} gave {type(result).__name__}, "
                         f"not one tensor", node_id)
    if shape is not None and "shape" not in stated and tuple(shape) != result.shape:
        raise GraphError(f"{op.name} gives shape {result.shape}, but the node states "
                         f"{tuple(shape)}", node_id)
    if dtype is not None and "dtype" not in stated and dtype != result.dtype:
        raise GraphError(f"{op.name} gives dtype {result.dtype}, but the node states {dtype}",
                         node_id)
    given = {node.id for node in operands}
    if result.node.id in given:  # (the function gave an operand back: clip without bounds)
        from deepx_flow.compiler.infer import new_node
        result = Tensor(new_node("reshape", [result.node], result.shape), (result,))
    made = [node for node in build_graph(result).nodes if node.id not in given]
    last = made[-1]
    return made[:-1] + [Node(node_id, last.op, last.inputs, last.shape, last.dtype,
                             last.attrs)]


def _operand_names(op: Operator, count: int, node_id: str) -> list[str]:
    """The composite's input names the `count` operands take, in order."""
    names = op.input_names()
    required = [n for n in names if n not in op.optional_inputs()]
    if not len(required) <= count <= len(names):
        wanted = (f"{len(names)}" if len(names) == len(required)
                  else f"{len(required)} to {len(names)}")
        raise GraphError(f"{op.name} takes {wanted} input(s) ({', '.join(op.inputs)}), got "
                         f"{count}", node_id)
    return list(names[:count])


def _function(op: Operator):
    """The Python function a composite names: `dx.name`, `dx.nn.name`, or (an extra
    table's) `package.module:name`."""
    import importlib

    import deepx_flow as dx
    if ":" in op.python:
        module, _, name = op.python.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise GraphError(f"{op.name} is expanded by {op.python}, which cannot be "
                             f"imported here: {err}") from None
    module, _, name = op.python.rpartition(".")
    return getattr(dx if module == "dx" else dx.nn, name)


__all__ = ["check_attrs", "composites", "expand"]
