"""The reference for `train_tiny_lm.py`: the same decoder-only language model as
`dx.nn.TransformerLM`, its forward and backward pass written out in NumPy in float64, and
the same Adam. An independent implementation (plain softmax attention over the whole
sequence, not deepx_flow's blocks), so that equal losses mean the same computation.
"""

from __future__ import annotations

import math

import numpy as np

GELU_C = math.sqrt(2.0 / math.pi)


def _ln(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    inv = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    xhat = xc * inv
    return xhat * g + b, (xhat, inv, g)


def _ln_back(dy, cache):
    xhat, inv, g = cache
    dg = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)
    db = dy.reshape(-1, xhat.shape[-1]).sum(0)
    dxhat = dy * g
    dx = inv * (dxhat - dxhat.mean(-1, keepdims=True)
                - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dg, db


def _gelu(u):
    t = np.tanh(GELU_C * (u + 0.044715 * u ** 3))
    return 0.5 * u * (1 + t), t


def _gelu_back(du_out, u, t):
    return du_out * (0.5 * (1 + t) + 0.5 * u * (1 - t * t) * GELU_C * (1 + 3 * 0.044715 * u * u))


def loss_and_grads(p: dict, tokens: np.ndarray, targets: np.ndarray, layers: int, heads: int,
                   grads: bool = True):
    """Mean next-token cross-entropy of `tokens` (batch, length), and its gradients."""
    B, T = tokens.shape
    E = p["tokens"]
    V, d = E.shape
    dh = d // heads
    mask = np.tril(np.ones((T, T), bool))
    x = E[tokens] + p["positions"][:T]
    caches = []
    for i in range(layers):
        a1, ln1 = _ln(x, p[f"{i}.ln1.scale"], p[f"{i}.ln1.bias"])
        q, k, v = (a1 @ p[f"{i}.attn.{n}"] for n in "qkv")
        split = lambda t: t.reshape(B, T, heads, dh).transpose(0, 2, 1, 3)
        qh, kh, vh = split(q), split(k), split(v)
        s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(dh)
        s = np.where(mask, s, -np.inf)
        s = s - s.max(-1, keepdims=True)
        w = np.exp(s)
        w /= w.sum(-1, keepdims=True)
        oh = w @ vh
        o = oh.transpose(0, 2, 1, 3).reshape(B, T, d)
        h = x + o @ p[f"{i}.attn.out"]
        a2, ln2 = _ln(h, p[f"{i}.ln2.scale"], p[f"{i}.ln2.bias"])
        u = a2 @ p[f"{i}.mlp.up"] + p[f"{i}.mlp.up_bias"]
        z, t = _gelu(u)
        x = h + z @ p[f"{i}.mlp.down"] + p[f"{i}.mlp.down_bias"]
        caches.append((a1, ln1, qh, kh, vh, w, o, a2, ln2, u, z, t))
    af, lnf = _ln(x, p["final.scale"], p["final.bias"])
    logits = af @ E.T
    logits = logits - logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(-1, keepdims=True)
    n = B * T
    flat = probs.reshape(n, V)
    loss = -np.log(flat[np.arange(n), targets.reshape(n)]).mean()
    if not grads:
        return loss, None
    g = {name: np.zeros_like(value) for name, value in p.items()}
    dlogits = flat.copy()
    dlogits[np.arange(n), targets.reshape(n)] -= 1
    dlogits = (dlogits / n).reshape(B, T, V)
    g["tokens"] += np.einsum("btv,btd->vd", dlogits, af)  # tied: the output projection
    dx, g["final.scale"], g["final.bias"] = _ln_back(dlogits @ E, lnf)
    for i in reversed(range(layers)):
        a1, ln1, qh, kh, vh, w, o, a2, ln2, u, z, t = caches[i]
        g[f"{i}.mlp.down"] = np.einsum("btk,btd->kd", z, dx)
        g[f"{i}.mlp.down_bias"] = dx.reshape(-1, d).sum(0)
        du = _gelu_back(dx @ p[f"{i}.mlp.down"].T, u, t)
        g[f"{i}.mlp.up"] = np.einsum("btd,btk->dk", a2, du)
        g[f"{i}.mlp.up_bias"] = du.reshape(-1, du.shape[-1]).sum(0)
        da2 = du @ p[f"{i}.mlp.up"].T
        dh_, g[f"{i}.ln2.scale"], g[f"{i}.ln2.bias"] = _ln_back(da2, ln2)
        dh_ = dh_ + dx
        g[f"{i}.attn.out"] = np.einsum("btd,bte->de", o, dh_)
        do = (dh_ @ p[f"{i}.attn.out"].T).reshape(B, T, heads, dh).transpose(0, 2, 1, 3)
        dvh = w.transpose(0, 1, 3, 2) @ do
        dw = do @ vh.transpose(0, 1, 3, 2)
        ds = w * (dw - (dw * w).sum(-1, keepdims=True)) / math.sqrt(dh)
        dqh, dkh = ds @ kh, ds.transpose(0, 1, 3, 2) @ qh
        merge = lambda t: t.transpose(0, 2, 1, 3).reshape(B, T, d)
        da1 = 0
        for name, dpart in (("q", merge(dqh)), ("k", merge(dkh)), ("v", merge(dvh))):
            g[f"{i}.attn.{name}"] = np.einsum("btd,bte->de", a1, dpart)
            da1 = da1 + dpart @ p[f"{i}.attn.{name}"].T
        dx1, g[f"{i}.ln1.scale"], g[f"{i}.ln1.bias"] = _ln_back(da1, ln1)
        dx = dh_ + dx1
    np.add.at(g["tokens"], tokens.reshape(-1), dx.reshape(-1, d))
    g["positions"][:T] += dx.sum(0)
    return loss, g


def train(params: dict, tokens, targets, steps: int, layers: int, heads: int, lr: float,
          betas=(0.9, 0.999), eps: float = 1e-8):
    """Full-batch Adam, as `dx.optim.Adam` steps: the losses and the final parameters."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2 = betas
    losses = []
    for step in range(1, steps + 1):
        loss, g = loss_and_grads(p, tokens, targets, layers, heads)
        losses.append(loss)
        c1, c2 = 1 - b1 ** step, 1 - b2 ** step
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v2[k] = b2 * v2[k] + (1 - b2) * g[k] * g[k]
            p[k] = p[k] - (lr / c1) * m[k] / (np.sqrt(v2[k]) / math.sqrt(c2) + eps)
    return losses, p
