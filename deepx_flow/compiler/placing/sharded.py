"""Sharded (ZeRO-3, FSDP): each worker keeps 1/n of the parameter and of its state along its
first axis. A step gathers the whole parameter where it uses it, forward and again backward
(it is not kept in between), and the gradient is reduce-scattered back to the shards, where
the optimizer updates them; a gradient's shard lives from then to its update."""

from __future__ import annotations

from deepx_flow.compiler.placing.strategy import Strategy


class Sharded(Strategy):
    name = "sharded"

    def applies(self, p, workers):
        return workers > 1 and len(p.shape) >= 1 and p.shape[0] >= workers

    def kept(self, p, workers):
        # the largest shard: rows of the first axis, split as evenly as they go
        return p.kept_between_steps * -(-p.shape[0] // workers) * (p.nbytes // p.shape[0])

    def gathered(self, p, workers):
        # the whole parameter where it is used, and its whole gradient before the
        # reduce-scatter
        return 2 * p.nbytes

    def collectives(self, p, workers):
        return [("all_gather", p.nbytes), ("all_gather", p.nbytes),
                ("reduce_scatter", p.nbytes)]

    def axis(self, p, workers):
        return 0
