"""Causal self-attention computed in blocks, so that no task holds a whole
sequence-by-sequence matrix of scores (as FlashAttention computes it; Dao et al. 2022).

The sequence is cut into blocks of `block` positions. Query block i meets key blocks 0..i
(the later ones are masked out entirely, so they are never computed): for each pair a
`block x block` tile of scores, `q_i @ k_j^T / sqrt(d)`, the diagonal tile causally masked.
Each query row's largest score over its tiles is subtracted before exponentiating (the
softmax is unchanged by it and nothing overflows), and the row's output is the sum over
its tiles of `exp(s_ij - m_i) @ v_j`, divided by the sum of those exponentials. Every node
of the graph, and of its gradient (the `differentiate` pass runs through the same tiles),
is at most one tile: memory grows with the sequence length times the block, not with its
square.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.sdk import functions as F
from deepx_flow.sdk.bindings import constant
from deepx_flow.sdk.functions import as_tensor
from deepx_flow.sdk.tensor import Tensor


def causal_attention(q, k, v, block: int = 128) -> Tensor:
    """`softmax(q @ k^T / sqrt(d) + causal mask) @ v` over the last two axes
    (..., sequence, d), computed in tiles of `block` positions (see the module docstring).
    Leading axes (batch, heads) are batch axes."""
    q, k, v = as_tensor(q), as_tensor(k, q), as_tensor(v, q)
    if q.ndim < 2 or q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise GraphError(f"causal_attention takes q and k of one shape (..., sequence, d) and "
                         f"v of (..., sequence, d_v), got {q.shape}, {k.shape}, {v.shape}",
                         q.node.id)
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise GraphError(f"causal_attention: block is a positive number of positions, got "
                         f"{shown(block)}", q.node.id)
    axis = q.ndim - 2
    length, d = q.shape[-2], q.shape[-1]
    bounds = list(range(0, length, block)) + [length]
    scale = 1.0 / math.sqrt(d)
    swap = tuple(range(q.ndim - 2)) + (q.ndim - 1, q.ndim - 2)

    def pieces(t: Tensor) -> list[Tensor]:
        return [t[..., lo:hi, :] for lo, hi in zip(bounds, bounds[1:])]
    qs, ks, vs = pieces(q * scale), pieces(k), pieces(v)
    outs = []
    for i, qi in enumerate(qs):
        tiles = [qi @ F.transpose(ks[j], swap) for j in range(i + 1)]
        tiles[i] = F.where(_causal(qi.shape[-2]), tiles[i], -np.inf)
        top = F.max(tiles[0], axis=-1, keepdims=True)
        for t in tiles[1:]:
            top = F.maximum(top, F.max(t, axis=-1, keepdims=True))
        weights = [F.exp(t - top) for t in tiles]
        total = weights[0].sum(axis=-1, keepdims=True)
        out = weights[0] @ vs[0]
        for j in range(1, i + 1):
            total = total + weights[j].sum(axis=-1, keepdims=True)
            out = out + weights[j] @ vs[j]
        outs.append(out / total)
    return outs[0] if len(outs) == 1 else F.concat(outs, axis=axis)


def _causal(size: int) -> Tensor:
    """The diagonal tile's mask: position r sees positions up to r."""
    return constant(np.tril(np.ones((size, size), dtype=bool)))
