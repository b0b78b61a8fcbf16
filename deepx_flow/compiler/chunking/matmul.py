"""Matmul: M with the left operand, N with the right, K (an index space, `<id>#k`) on both,
batch axes with the operands' that are not broadcast; extra operands (a fused epilogue's)
like the result. Tasks compute a tile for a chunk of K, and the partials are summed in a
tree."""

from __future__ import annotations

import math

from deepx_flow.compiler.chunking.classes import combined_tasks, count, regular_chunks
from deepx_flow.compiler.chunking.rule import Rule, fanin_for, nbytes
from deepx_flow.compiler.costs import combine_cost, main_cost


def k_space(node) -> str:
    return node.id + "#k"


class Matmul(Rule):
    def spaces(self, node, inputs):
        return {k_space(node): (inputs[0].shape[-1],)}

    def join(self, node, inputs, s, join_whole_axes):
        classes = s.classes
        a, b = inputs[0], inputs[1]
        space = k_space(node)
        classes.add((space, 0), a.shape[-1])
        classes.union((a.id, a.ndim - 1), (space, 0))
        classes.union((b.id, b.ndim - 2), (space, 0))
        classes.union((a.id, a.ndim - 2), (node.id, node.ndim - 2))
        classes.union((b.id, b.ndim - 1), (node.id, node.ndim - 1))
        batch = node.shape[:-2]
        for t in (a, b):
            off = len(batch) - (t.ndim - 2)
            for j in range(t.ndim - 2):
                if t.shape[j] == batch[j + off] and t.shape[j] != 1:
                    classes.union((t.id, j), (node.id, j + off))
        for t in inputs[2:]:
            classes.align(t, node.shape, node.id)

    def task_keys(self, node, s):
        return super().task_keys(node, s) + [(k_space(node), 0)]

    def cost(self, node, inputs, s):
        return main_cost(node, inputs, s.chunk_of, None, s.chunk((k_space(node), 0)))

    def peak(self, node, inputs, s):
        # the tree that sums the partials holds two result chunks at once
        return max(self.cost(node, inputs, s).working_set,
                   combine_cost(nbytes(s.chunk_of(node.id), node.dtype), 2))

    def summed(self, node):
        return [(k_space(node), 0)]

    def wanted_tasks(self, node, s, target, threads):
        # Every extra tile reads a whole block of the other operand again, and the tasks are
        # long and even: half the tasks per thread do, unless one operand is small enough
        # (a layer's weights) that reading it again costs nothing.
        return target if _small_operand(node, s, target) else max(threads, target // 2)

    def partial_bytes(self, node, cost, s):
        return nbytes(s.chunk_of(node.id), node.dtype)

    def tasks(self, node, s, counts, fanin):
        n_out = math.prod(counts[node.id])
        fanin[node.id] = fanin_for(nbytes(s.chunk_of(node.id), node.dtype), s)
        k = s.graph[node.inputs[0]].shape[-1]
        n_main = n_out * count(k, s.chunk((k_space(node), 0)))
        return self.task_count(n_main, n_out, fanin[node.id])

    def task_count(self, n_main, n_out, fanin, along=1):
        return combined_tasks(n_main, n_out, fanin) if n_main > n_out else n_main

    def planned(self, node, s):
        return {"k_chunks": regular_chunks(s.graph[node.inputs[0]].shape[-1],
                                           s.chunk((k_space(node), 0)))}


def _small_operand(node, s, target: int) -> bool:
    """Whether reading one operand once per task of the target count adds under a quarter
    of the bytes the matmul reads anyway."""
    sizes = [nbytes(s.graph[i].shape, s.graph[i].dtype) for i in node.inputs[:2]]
    return min(sizes) * target * 4 <= sum(sizes)
