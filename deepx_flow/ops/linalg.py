"""Matrix multiplication: 2-D and batched, `(..., M, K) @ (..., K, N)`.

Batch dimensions broadcast like NumPy's matmul. The compiler tiles it over M, N and K and sums
the K partial products with a tree reduction; 1-D operands are reshaped by the SDK first.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError
from deepx_flow.ops.common import broadcast, ufunc_dtype
from deepx_flow.ops.spec import MATMUL, OpSpec


def _infer_matmul(node, inputs):
    a, b = inputs
    if a.ndim < 2 or b.ndim < 2:
        raise GraphError(f"matmul needs operands of at least 2 dimensions, got {a.shape} and "
                         f"{b.shape}; reshape a vector to (n, 1) first", node.id)
    if a.shape[-1] != b.shape[-2]:
        raise GraphError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} "
                         f"({a.shape[-1]} != {b.shape[-2]})", node.id)
    batch = broadcast(node, [a.shape[:-2], b.shape[:-2]])
    return batch + (a.shape[-2], b.shape[-1]), ufunc_dtype(node, np.matmul, [a.dtype, b.dtype])


def specs() -> list[OpSpec]:
    return [OpSpec("matmul", MATMUL, 2, _infer_matmul, doc="(..., M, K) @ (..., K, N)")]
