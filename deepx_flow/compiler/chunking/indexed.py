"""Scatters and element gathers: as the operator's own `Tiling` (`ops/scatter.py`) says."""

from __future__ import annotations

from deepx_flow.compiler.chunking.rule import Rule
from deepx_flow.ops import get_op


class Indexed(Rule):
    def join(self, node, inputs, s, join_whole_axes):
        # operand axes chunked like result axes where their extents agree (a shorter
        # operand is assembled by the lowering), and the result axes its tasks hold whole
        tiling = get_op(node.op).tiling
        for at, axis, out_axis in tiling.aligned(node, inputs):
            if inputs[at].shape[axis] == node.shape[out_axis]:
                s.classes.union((inputs[at].id, axis), (node.id, out_axis))
        for axis in tiling.whole(node, inputs):
            s.classes.keep_whole((node.id, axis), f"'{node.id}' ({node.op})")
