"""Elementwise nodes (fused programs too): operands chunked like the result."""

from __future__ import annotations

from deepx_flow.compiler.chunking.rule import Rule
from deepx_flow.ir.program import whole_axes


class Elementwise(Rule):
    def join(self, node, inputs, s, join_whole_axes):
        for t in inputs:
            s.classes.align(t, node.shape, node.id)
        for axis in whole_axes(node.attr("program")):  # a fused softmax's axis
            s.classes.keep_whole((node.id, axis), f"'{node.id}' (fused softmax)")
