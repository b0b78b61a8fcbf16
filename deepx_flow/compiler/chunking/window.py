"""Convolutions and pools: chunked by batch and spatial axes. A task reads its images'
channels whole, the input positions its windows cover (a halo into the neighbouring chunks,
which the lowering assembles), and the whole weights."""

from __future__ import annotations

from deepx_flow.compiler.chunking.rule import Rule


class Window(Rule):
    def join(self, node, inputs, s, join_whole_axes):
        s.classes.union((inputs[0].id, 0), (node.id, 0))
        s.classes.keep_whole((node.id, 1), f"'{node.id}' ({node.op}: its channels)")

    def split_last(self, node):
        # an image is cut into spatial pieces (whose halos are read twice) only when one
        # image does not fit
        return [(node.id, a) for a in range(2, node.ndim)]
