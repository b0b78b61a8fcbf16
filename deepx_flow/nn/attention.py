"""Causal self-attention computed in blocks, so that no task holds a whole
sequence-by-sequence matrix of scores (as FlashAttention computes it; Dao et al. 2022).

The sequence is cut into blocks of `block` positions. Query block i meets key blocks 0..i
(the later ones are masked out entirely, so they are never computed): for each pair a
`block x block` tile of scores, `q_i @ k_j^T / sqrt(d)`, the diagonal tile causally masked.
The tiles of a query block are taken in order with FlashAttention's online softmax: the
largest score of each row so far is subtracted before exponentiating (nothing overflows),
and the sum of exponentials and the weighted sum of values made so far are rescaled when
it grows; the output is their quotient. Every node of the graph, and of its gradient (the
`differentiate` pass runs through the same tiles), is at most one tile or one block of
positions (a query block's rows of q and of the output), and the forward
pass holds a few tiles per query block at once: its memory grows with the sequence length
times the block, not with its square. (The backward pass reads the forward's tiles, which
wait for it: a training step holds all of them, spread over its tasks; FlashAttention
computes them again instead.)
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.sdk import functions as F
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
    if q.shape[-1] == 0 or q.shape[-2] == 0:
        raise GraphError(f"causal_attention takes at least one position and one feature, "
                         f"got q of shape {q.shape}", q.node.id)
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
        # One pass over the key blocks, FlashAttention's online softmax: the row's largest
        # score so far (`top`), the sum of its exponentials and the weighted values, both
        # rescaled whenever `top` grows. Each tile is read by one step of one chain, so a
        # few tiles per query block are alive at once, whatever order the tasks run in.
        top = total = out = None
        for j in range(i + 1):
            tile = qi @ F.transpose(ks[j], swap)
            if j == i:
                tile = F.where(_causal(qi.shape[-2]), tile, -np.inf)
            tile_top = F.max(tile, axis=-1, keepdims=True)
            new_top = tile_top if top is None else F.maximum(top, tile_top)
            weights = F.exp(tile - new_top)
            if top is None:
                total, out = weights.sum(axis=-1, keepdims=True), weights @ vs[j]
            else:
                rescale = F.exp(top - new_top)
                total = total * rescale + weights.sum(axis=-1, keepdims=True)
                out = out * rescale + weights @ vs[j]
            top = new_top
        outs.append(out / total)
    return outs[0] if len(outs) == 1 else F.concat(outs, axis=axis)


def _causal(size: int) -> Tensor:
    """The diagonal tile's mask: position r sees positions up to r. Computed in the graph
    (not a constant bound as data), so that a training step's graph reads no data but its
    batch and parameters."""
    positions = F.arange(size)
    return F.reshape(positions, (size, 1)) >= F.reshape(positions, (1, size))
