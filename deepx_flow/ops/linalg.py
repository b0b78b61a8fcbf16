"""Matrix multiplication: 2-D and batched, `(..., M, K) @ (..., K, N)`.

Batch dimensions broadcast like NumPy's matmul. The compiler tiles it over M, N and K and sums
the K partial products with a tree reduction; 1-D operands are reshaped by the SDK first.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from deepx_flow.errors import GraphError
from deepx_flow.ir.node import Node
from deepx_flow.ops.common import broadcast, ufunc_dtype
from deepx_flow.ops.programs import program_dtype
from deepx_flow.ops.registry import OPS
from deepx_flow.ops.spec import MATMUL, OpSpec


def _infer_matmul(node, inputs):
    if node.attr("epilogue") is not None:
        return _infer_with_epilogue(node, inputs)
    if len(inputs) != 2:
        raise GraphError(f"matmul takes 2 inputs, got {len(inputs)}", node.id)
    a, b = inputs
    if a.ndim < 2 or b.ndim < 2:
        raise GraphError(f"matmul needs operands of at least 2 dimensions, got {a.shape} and "
                         f"{b.shape}; reshape a vector to (n, 1) first", node.id)
    if a.shape[-1] != b.shape[-2]:
        raise GraphError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} "
                         f"({a.shape[-1]} != {b.shape[-2]})", node.id)
    batch = broadcast(node, [a.shape[:-2], b.shape[:-2]])
    return batch + (a.shape[-2], b.shape[-1]), ufunc_dtype(node, np.matmul, [a.dtype, b.dtype])


def _infer_with_epilogue(node, inputs):
    """A compiled matmul whose result feeds a fused elementwise program (`in0` = product)."""
    shape, product = _infer_matmul(replace(node, attrs=()), inputs[:2])
    out = broadcast(node, [shape] + [t.shape for t in inputs[2:]])
    if out != shape:
        raise GraphError(f"matmul epilogue operands broadcast the product {shape} to {out}",
                         node.id)
    operands = [Node("product", "matmul", (), shape, product)] + list(inputs[2:])
    return shape, program_dtype(node, "epilogue", node.attr("epilogue"), operands, OPS)


def _matmul_vjp(e, node, inputs, g):
    """C = A @ B: dA = dC @ B^T, dB = A^T @ dC (T swaps the last two axes); batch axes that
    were broadcast are summed back by `differentiate`."""
    a, b = inputs[:2]
    return e("matmul", g, _swap_last(e, b)), e("matmul", _swap_last(e, a), g)


def _swap_last(e, x):
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return e("transpose", x, axes=axes)


def specs() -> list[OpSpec]:
    return [OpSpec("matmul", MATMUL, None, _infer_matmul, compiler_attrs=("epilogue",),
                   doc="(..., M, K) @ (..., K, N)", vjp=_matmul_vjp)]
