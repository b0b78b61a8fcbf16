"""Replicated (data parallelism): every worker keeps the whole parameter, its gradient and
its state, and the gradients of the batch's shards are all-reduced."""

from __future__ import annotations

from deepx_flow.compiler.placing.strategy import Strategy


class Replicated(Strategy):
    name = "replicated"

    def kept(self, p, workers):
        return p.copies * p.nbytes

    def collectives(self, p, workers):
        return [("all_reduce", p.nbytes)]
