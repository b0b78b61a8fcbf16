"""Reductions: the operand space they reduce (their prologue's result, or their operand: an
index space, `<id>#in`) chunked like the operands, its kept axes like the result. Tasks
reduce a chunk of that space to a partial, and the partials of a result chunk are combined
in a tree."""

from __future__ import annotations

import math

from deepx_flow.compiler.chunking.classes import combined_tasks, count, regular_chunks
from deepx_flow.compiler.chunking.rule import Rule, fanin_for
from deepx_flow.compiler.costs import combine_cost, main_cost, reduce_space
from deepx_flow.ir.program import whole_axes


def in_space(node) -> str:
    return node.id + "#in"


class Reduce(Rule):
    def spaces(self, node, inputs):
        return {in_space(node): reduce_space(inputs)}

    def join(self, node, inputs, s, join_whole_axes):
        classes = s.classes
        space = in_space(node)
        shape = s.spaces[space]
        for axis, extent in enumerate(shape):
            classes.add((space, axis), extent)
        for t in inputs:
            classes.align(t, shape, space)
        for axis in whole_axes(node.attr("prologue")):
            classes.keep_whole((space, axis), f"'{node.id}' (softmax in its prologue)")
        axes = node.attr("axes")
        keep = node.attr("keepdims", False)
        out_axis = 0
        for axis in range(len(shape)):
            if axis in axes:
                out_axis += 1 if keep else 0
                continue
            classes.union((space, axis), (node.id, out_axis))
            out_axis += 1

    def task_keys(self, node, s):
        return s.space_keys(in_space(node))

    grid_keys = task_keys

    def cost(self, node, inputs, s):
        return main_cost(node, inputs, s.chunk_of, s.space_chunk(in_space(node)))

    def peak(self, node, inputs, s):
        cost = self.cost(node, inputs, s)
        return max(cost.working_set, combine_cost(cost.bytes_out, 2))

    def summed(self, node):
        return [(in_space(node), a) for a in node.attr("axes")]

    def partial_bytes(self, node, cost, s):
        return cost.bytes_out

    def tasks(self, node, s, counts, fanin):
        n_out = math.prod(counts[node.id])
        fanin[node.id] = fanin_for(self.cost(node, s.inputs(node), s).bytes_out, s)
        space = in_space(node)
        n_main = math.prod(count(e, s.chunk((space, a)))
                           for a, e in enumerate(s.spaces[space]))
        return self.task_count(n_main, n_out, fanin[node.id])

    def task_count(self, n_main, n_out, fanin, along=1):
        # (a result chunk's only partial is computed inside its finishing task: one task)
        return n_out if n_main == n_out else combined_tasks(n_main, n_out, fanin)

    def planned(self, node, s):
        space = in_space(node)
        return {"spaces": tuple(regular_chunks(e, s.chunk((space, a)))
                                for a, e in enumerate(s.spaces[space]))}
