"""Gather along an axis: the result's axes are x's before `axis`, the indices', then x's
after it; x's own `axis` is read whole by each task (assembled if x is split along it)."""

from __future__ import annotations

from deepx_flow.compiler.chunking.rule import Rule


class Gather(Rule):
    def join(self, node, inputs, s, join_whole_axes):
        x, indices = inputs
        axis = node.attr("axis")
        for a in range(axis):
            s.classes.union((x.id, a), (node.id, a))
        for j in range(indices.ndim):
            s.classes.union((indices.id, j), (node.id, axis + j))
        for a in range(axis + 1, x.ndim):
            s.classes.union((x.id, a), (node.id, a - 1 + indices.ndim))
