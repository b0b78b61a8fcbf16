"""Operators that need one axis whole (softmax, sorting along an axis): the result chunked
like the operand, that axis never split."""

from __future__ import annotations

from deepx_flow.compiler.chunking.rule import Rule


class AxisWhole(Rule):
    frees_whole_axis = True

    def join(self, node, inputs, s, join_whole_axes):
        # Unless it is joined, the whole axis leaves the operand free to be split along it
        # for other users, and each task assembles the rows it needs.
        (t,) = inputs
        whole = node.attr("axis")
        for axis in range(node.ndim):
            if axis != whole or join_whole_axes:
                s.classes.union((t.id, axis), (node.id, axis))
        s.classes.keep_whole((node.id, whole), f"'{node.id}' ({node.op})")
