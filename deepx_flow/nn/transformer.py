"""A decoder-only language model (GPT-2's shape): token and position embeddings, blocks of
causal self-attention and a GELU MLP, each after a layer norm and added back (pre-norm),
a last layer norm, and logits from the token embedding itself (weight tying: its gradient
gathers both uses). The attention is computed in blocks (`nn/attention.py`).

Parameters are named by where they are: `tokens`, `positions`, `<layer>.attn.q` (and `k`,
`v`, `out`), `<layer>.ln1.scale`, `<layer>.mlp.up`, `final.scale`, ...; weights are
(inputs, outputs), initialized normal with standard deviation 0.02 as GPT-2's, the
projections back into the residual stream scaled by 1/sqrt(2 layers); norms start at 1 and
0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepx_flow.errors import GraphError, shown
from deepx_flow.nn.attention import causal_attention
from deepx_flow.nn.functional import cross_entropy
from deepx_flow.nn.normalization import layer_norm
from deepx_flow.sdk import functions as F, random
from deepx_flow.sdk.functions import as_tensor
from deepx_flow.sdk.tensor import Tensor


@dataclass(frozen=True)
class TransformerLM:
    vocab: int
    length: int          # the longest sequence (positions embedded)
    dim: int
    heads: int
    layers: int
    block: int = 128     # attention tile, in positions
    hidden: int | None = None  # the MLP's width (default 4 x dim)
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab", "length", "dim", "heads", "layers", "block"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GraphError(f"TransformerLM: {name} must be a positive integer, got "
                                 f"{shown(value)}")
        if self.hidden is not None and (not isinstance(self.hidden, int)
                                        or isinstance(self.hidden, bool) or self.hidden < 1):
            raise GraphError(f"TransformerLM: hidden must be a positive integer or None (4 x "
                             f"dim), got {shown(self.hidden)}")
        if self.dim % self.heads:
            raise GraphError(f"TransformerLM: dim {self.dim} is not a multiple of heads "
                             f"{self.heads}")

    @property
    def width(self) -> int:
        return 4 * self.dim if self.hidden is None else self.hidden

    def shapes(self) -> dict[str, tuple[int, ...]]:
        d, h = self.dim, self.width
        out = {"tokens": (self.vocab, d), "positions": (self.length, d)}
        for i in range(self.layers):
            out.update({f"{i}.ln1.scale": (d,), f"{i}.ln1.bias": (d,),
                        f"{i}.attn.q": (d, d), f"{i}.attn.k": (d, d), f"{i}.attn.v": (d, d),
                        f"{i}.attn.out": (d, d), f"{i}.ln2.scale": (d,), f"{i}.ln2.bias": (d,),
                        f"{i}.mlp.up": (d, h), f"{i}.mlp.up_bias": (h,),
                        f"{i}.mlp.down": (h, d), f"{i}.mlp.down_bias": (d,)})
        out.update({"final.scale": (d,), "final.bias": (d,)})
        return out

    def init(self, seed: int = 0) -> dict[str, Tensor]:
        out = {}
        residual = 0.02 / math.sqrt(2 * self.layers)
        for i, (name, shape) in enumerate(self.shapes().items()):
            if name.endswith("scale"):
                out[name] = F.full(shape, 1.0, self.dtype)
            elif name.endswith("bias"):
                out[name] = F.full(shape, 0.0, self.dtype)
            else:
                std = residual if name.endswith((".out", ".down")) else 0.02
                out[name] = random.normal(shape, seed=random.derive_seed(seed, i), std=std,
                                          dtype=self.dtype)
        return out

    def __call__(self, params, tokens) -> Tensor:
        """Logits (batch, sequence, vocab) of the next token at every position."""
        tokens = as_tensor(tokens)
        missing = [n for n in self.shapes() if n not in params]
        if missing:
            raise GraphError(f"TransformerLM: missing parameters {', '.join(missing[:4])}")
        if tokens.ndim != 2 or tokens.shape[1] > self.length:
            raise GraphError(f"TransformerLM takes token ids (batch, sequence <= "
                             f"{self.length}), got {tokens.shape}", tokens.node.id)
        p = {k: as_tensor(v) for k, v in params.items()}
        batch, length = tokens.shape
        x = F.take(p["tokens"], tokens, axis=0) + p["positions"][:length]
        for i in range(self.layers):
            a = layer_norm(x, p[f"{i}.ln1.scale"], p[f"{i}.ln1.bias"])
            x = x + self._attention(p, i, a, batch, length)
            a = layer_norm(x, p[f"{i}.ln2.scale"], p[f"{i}.ln2.bias"])
            up = F.gelu(a @ p[f"{i}.mlp.up"] + p[f"{i}.mlp.up_bias"])
            x = x + (up @ p[f"{i}.mlp.down"] + p[f"{i}.mlp.down_bias"])
        x = layer_norm(x, p["final.scale"], p["final.bias"])
        return x @ F.transpose(p["tokens"])  # the token embedding, tied

    def _attention(self, p, i: int, a: Tensor, batch: int, length: int) -> Tensor:
        heads, per = self.heads, self.dim // self.heads

        def split(t: Tensor) -> Tensor:  # (batch, length, dim) -> (batch, heads, length, per)
            return F.transpose(F.reshape(t, (batch, length, heads, per)), (0, 2, 1, 3))
        q, k, v = (split(a @ p[f"{i}.attn.{n}"]) for n in ("q", "k", "v"))
        o = causal_attention(q, k, v, block=self.block)
        o = F.reshape(F.transpose(o, (0, 2, 1, 3)), (batch, length, self.dim))
        return o @ p[f"{i}.attn.out"]

    def loss(self, params, tokens, targets) -> Tensor:
        """Mean cross-entropy of the next token."""
        logits = self(params, tokens)
        return cross_entropy(F.reshape(logits, (-1, self.vocab)), F.reshape(targets, (-1,)))
