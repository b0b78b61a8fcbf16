"""Scans (cumulative sums and products): chunked like the operand on every axis; along the
scanned one each chunk takes the carry of those before it (`lower`)."""

from __future__ import annotations

import math

from deepx_flow.compiler.chunking.rule import Rule


class Scan(Rule):
    def join(self, node, inputs, s, join_whole_axes):
        (t,) = inputs
        for axis in range(node.ndim):
            s.classes.union((t.id, axis), (node.id, axis))

    def split_last(self, node):
        # A split adds a total and a carry per line of chunks, and has its chunks read
        # twice (their totals, then their scans).
        return [(node.id, node.attr("axis"))]

    summed = split_last

    def tasks(self, node, s, counts, fanin):
        n_out = math.prod(counts[node.id])
        return self.task_count(n_out, n_out, 2, counts[node.id][node.attr("axis")])

    def task_count(self, n_main, n_out, fanin, along=1):
        # per line of chunks along the axis, a total of each but the last in scan order
        # and a carry of each from the third on
        return n_out + n_out // along * (max(0, along - 1) + max(0, along - 2))
