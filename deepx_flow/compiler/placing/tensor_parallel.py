"""Tensor parallel (Megatron's column split): a weight w (K, N) that matmuls use as `x @ w`
is split along N, so no worker holds it whole, nor its gradient or state; its gradient
needs no collective (each worker computes its own columns'). The activations move instead.
Forward, every worker gathers x's rows of the whole batch (an all-gather of rows x K, which
it then holds) and computes its columns of the result, which go back to the workers of
their rows (an all-to-all of rows x N). Backward, the result's gradient comes to the
columns' workers the other way (an all-to-all of rows x N), and the partial gradients of x
(every worker's columns contribute to every row) are reduce-scattered back to the rows
(rows x K). So it pays where the batch is small against the weight.
"""

from __future__ import annotations

from deepx_flow.compiler.placing.strategy import Strategy


class TensorParallel(Strategy):
    name = "tensor_parallel"
    splits_arithmetic = True

    def applies(self, p, workers):
        return workers > 1 and bool(p.uses) and len(p.shape) == 2 and p.shape[1] >= workers

    def kept(self, p, workers):
        # the widest slice of columns
        return p.kept_between_steps * self._slice(p, workers)

    def gathered(self, p, workers):
        # the whole batch's rows of x, for the largest of its uses, and the gradient's slice
        # from the backward pass to the update
        return max(use.rows * use.k * use.itemsize for use in p.uses) + self._slice(p, workers)

    @staticmethod
    def _slice(p, workers) -> int:
        return -(-p.shape[1] // workers) * (p.nbytes // p.shape[1])

    def collectives(self, p, workers):
        out = []
        for use in p.uses:
            x, y = use.rows * use.k * use.itemsize, use.rows * use.n * use.itemsize
            out += [("all_gather", x), ("all_to_all", y), ("all_to_all", y),
                    ("reduce_scatter", x)]
        return out

    def axis(self, p, workers):
        return 1
