"""The type rule of fused programs: the `program` of a `fused` node, a matmul's `epilogue`
and a reduction's `prologue` (the format is in `deepx_flow.ir.program`).

The fuser writes these, but a compiled graph can be written as YAML and read back, and a spec
may hold one written by hand; kernels trust them (an engine generates code from the
instructions). So a program is checked like any other node: every instruction is an
elementwise operator (or, in a fused node's program or a reduction's prologue, a whole-axis
softmax along an axis of the result space, see `ir.program`) with the right number of arguments, every argument names an operand, an
earlier result or a constant that fits its dtype, and every instruction states the dtype its
operator's own rule gives for its arguments. A program that passes computes what the nodes it
replaced computed.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node
from deepx_flow.ir.program import WHOLE_AXIS_OPS
from deepx_flow.ops.common import check_fits, ufunc_dtype
from deepx_flow.ops.spec import ELEMENTWISE, OpSpec


def program_dtype(node: Node, what: str, program, operands: list[Node],
                  ops: dict[str, OpSpec], ndim: int | None = None) -> str:
    """Check the program `what` of `node`; return the dtype of its result.

    Parameters
    ----------
    node : Node
        The node that carries the program (for messages).
    what : str
        The attribute's name: "program", "epilogue" or "prologue".
    program : any
        The attribute's value.
    operands : list of Node
        What `("in", k)` reads: typed nodes whose dtypes the program's inputs have.
    ops : dict
        The operator table (passed in: this module is part of building it).
    ndim : int, optional
        The number of axes of the space the program computes in, where it may hold whole-axis
        instructions (a fused node's program, a reduction's prologue); None where it may not.

    Returns
    -------
    str
        The dtype of the last instruction.

    Raises
    ------
    GraphError
        Naming the node, the attribute and the instruction at fault.
    """
    if not isinstance(program, tuple) or not program:
        raise GraphError(f"{node.op}: {what} must be a non-empty list of instructions "
                         f"[op, [args...], dtype], got {shown(program)}", node.id)
    results: list[str] = []
    for j, instruction in enumerate(program):
        label = f"{what} instruction {j}"
        where = f"{node.op}: {label}"
        if not (isinstance(instruction, tuple) and len(instruction) == 3):
            raise GraphError(f"{where} must be [op, [args...], dtype], got "
                             f"{shown(instruction)}", node.id)
        op, args, dtype = instruction
        spec = ops.get(op) if isinstance(op, str) else None
        if spec is None:
            raise GraphError(f"{where}: unknown operator {shown(op)}", node.id)
        if op in WHOLE_AXIS_OPS:
            results.append(_whole_axis_dtype(node, what, j, args, dtype, results, operands,
                                             ndim))
            continue
        if spec.kind != ELEMENTWISE or not spec.fusable:
            raise GraphError(f"{where}: {op} is not an elementwise operator a program can run",
                             node.id)
        if not isinstance(dtype, str) or dtype not in dtypes.DTYPES:
            raise GraphError(f"{where}: dtype must be one of {', '.join(dtypes.DTYPES)}, got "
                             f"{shown(dtype)}", node.id)
        if not isinstance(args, tuple) or (spec.arity is not None and len(args) != spec.arity):
            raise GraphError(f"{where}: {op} takes {spec.arity} argument(s), got "
                             f"{shown(args)}", node.id)
        typed = [_argument(node, label, arg, j, results, operands) for arg in args]
        # The operator's own rule, on stand-ins of the argument dtypes (cast states its own).
        stand_in = Node(None, op, tuple(t.id for t in typed), None,
                        dtype if "dtype" in spec.declared else None)
        try:
            _, rule = spec.infer(stand_in, typed)
        except GraphError as err:
            raise GraphError(f"{where}: {err}", node.id) from None
        if rule != dtype:
            raise GraphError(f"{where}: {op} of {', '.join(t.dtype for t in typed)} gives "
                             f"{rule}, but the instruction states {dtype}", node.id)
        results.append(dtype)
    return results[-1]


def _whole_axis_dtype(node: Node, what: str, j: int, args, dtype, results: list[str],
                      operands: list[Node], ndim: int | None) -> str:
    """Check a whole-axis instruction `(op, (x, (c, axis, int64)), dtype)`; its dtype."""
    op = node.attr(what)[j][0]
    where = f"{node.op}: {what} instruction {j}"
    if ndim is None:
        raise GraphError(f"{where}: {op} cannot run in a {what} (only in a fused node's "
                         "program or a reduction's prologue)", node.id)
    axis = args[1] if isinstance(args, tuple) and len(args) == 2 else None
    if not (isinstance(axis, tuple) and len(axis) == 3 and axis[0] == "c" and
            axis[2] == "int64" and _index(axis[1]) and axis[1] < ndim):
        raise GraphError(f"{where}: {op} takes [value, [c, axis, int64]] with an axis of the "
                         f"{ndim}-D result, got {shown(args)}", node.id)
    x = _argument(node, f"{what} instruction {j}", args[0], j, results, operands)
    rule = ufunc_dtype(node, np.exp, [x.dtype])
    if not isinstance(dtype, str) or rule != dtype:
        raise GraphError(f"{where}: {op} of {x.dtype} gives {rule}, but the instruction "
                         f"states {shown(dtype)}", node.id)
    return dtype


def _argument(node: Node, label: str, arg, j: int, results: list[str],
              operands: list[Node]) -> Node:
    """A 0-d stand-in for one argument, with the dtype the argument has."""
    where = f"{node.op}: {label}"
    kind = arg[0] if isinstance(arg, tuple) and arg else None
    if kind == "in" and len(arg) == 2 and _index(arg[1]):
        if arg[1] >= len(operands):
            raise GraphError(f"{where}: argument [in, {arg[1]}] but the program has "
                             f"{len(operands)} input(s)", node.id)
        return Node(f"in{arg[1]}", "input", (), (), operands[arg[1]].dtype)
    if kind == "t" and len(arg) == 2 and _index(arg[1]):
        if arg[1] >= j:
            raise GraphError(f"{where}: argument [t, {arg[1]}] must name an earlier "
                             "instruction", node.id)
        return Node(f"t{arg[1]}", "input", (), (), results[arg[1]])
    if kind == "c" and len(arg) == 3 and arg[2] in dtypes.DTYPES:
        check_fits(node, arg[1], arg[2], f"{label}: constant")
        return Node(f"c{j}", "input", (), (), arg[2])
    raise GraphError(f"{where}: argument {shown(arg)} must be [in, k], [t, j] or "
                     "[c, value, dtype]", node.id)


def _index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
