"""Tensor parallel (Megatron's column split): a weight w (K, N) that matmuls use as `x @ w`
is split along N, so no worker holds it whole, nor its gradient or state; its gradient
needs no collective (each worker computes its own columns'). The activations move instead:
forward, every worker gathers x's rows of the whole batch (all-gather of rows x K) and
computes its columns of the result, which go back to the rows' workers (a reduce-scatter's
traffic of rows x N); backward, the result's gradient is gathered likewise (rows x N), and
the partial gradients of x (every worker's columns contribute to every row) are
reduce-scattered back to the rows (rows x K). So it pays where the batch is small against
the weight."""

from __future__ import annotations

from deepx_flow.compiler.placing.strategy import Strategy


class TensorParallel(Strategy):
    name = "tensor_parallel"

    def applies(self, p, workers):
        return workers > 1 and bool(p.uses) and len(p.shape) == 2 and p.shape[1] >= workers

    def kept(self, p, workers):
        return p.copies * p.nbytes / workers

    def collectives(self, p, workers):
        out = []
        for use in p.uses:
            x, y = use.rows * use.k * use.itemsize, use.rows * use.n * use.itemsize
            out += [("all_gather", x), ("reduce_scatter", y), ("all_gather", y),
                    ("reduce_scatter", x)]
        return out

    def axis(self, p, workers):
        return 1
