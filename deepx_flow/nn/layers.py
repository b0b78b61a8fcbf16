"""Layers as functions of named parameter tensors.

A layer holds only its configuration (sizes, whether it has a bias). `init(seed)` gives its
parameters as a dict of named tensors (lazy random tensors, so initializing is part of a
graph like anything else), and calling it with parameters and an input builds its output.
There is no hidden state: the same parameters and input always build the same graph, and a
trained model is its configuration plus a dict of tensors.

    model = dx.nn.Sequential(dx.nn.Linear(784, 256), dx.nn.relu, dx.nn.Linear(256, 10))
    params = model.init(seed=0)        # {"0.weight": ..., "0.bias": ..., "2.weight": ...}
    logits = model(params, x)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.sdk import random
from deepx_flow.sdk.tensor import Tensor, as_tensor

Params = Mapping[str, Tensor]


@dataclass(frozen=True)
class Linear:
    """`x @ weight + bias`, with `weight` of shape (in_features, out_features).

    Initialized as PyTorch initializes its `Linear`: weight and bias uniform in
    `[-1/sqrt(in_features), 1/sqrt(in_features))`.
    """

    in_features: int
    out_features: int
    bias: bool = True
    dtype: str = "float32"

    def __post_init__(self):
        _check_sizes(self, "in_features", "out_features")
        if not dtypes.is_float(dtypes.normalize(self.dtype)):
            raise GraphError(f"Linear: parameters are floating point, not {self.dtype}")

    def init(self, seed: int = 0) -> dict[str, Tensor]:
        bound = 1.0 / math.sqrt(self.in_features)
        out = {"weight": random.uniform((self.in_features, self.out_features),
                                        seed=random.derive_seed(seed, 0), low=-bound,
                                        high=bound, dtype=self.dtype)}
        if self.bias:
            out["bias"] = random.uniform((self.out_features,), seed=random.derive_seed(seed, 1),
                                         low=-bound, high=bound, dtype=self.dtype)
        return out

    def __call__(self, params: Params, x) -> Tensor:
        x = as_tensor(x)
        weight = _param(params, "weight", (self.in_features, self.out_features))
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise GraphError(f"Linear({self.in_features}, {self.out_features}) takes inputs "
                             f"whose last axis is {self.in_features}, got {x.shape}",
                             x.node.id)
        y = x @ weight
        return y + _param(params, "bias", (self.out_features,)) if self.bias else y


@dataclass(frozen=True)
class Embedding:
    """Rows of a `(num_embeddings, dim)` table looked up by integer ids (`dx.take`), the table
    initialized standard normal as PyTorch's `Embedding` is. Its gradient adds each output
    row back to its id's row (see `ops.gather`)."""

    num_embeddings: int
    dim: int
    dtype: str = "float32"

    def __post_init__(self):
        _check_sizes(self, "num_embeddings", "dim")

    def init(self, seed: int = 0) -> dict[str, Tensor]:
        return {"weight": random.normal((self.num_embeddings, self.dim),
                                        seed=random.derive_seed(seed, 0), dtype=self.dtype)}

    def __call__(self, params: Params, ids) -> Tensor:
        from deepx_flow.sdk.functions import take
        return take(_param(params, "weight", (self.num_embeddings, self.dim)), ids, axis=0)


@dataclass(frozen=True)
class Sequential:
    """Layers applied in order. A layer is an object with `init` and `__call__(params, x)`
    (`Linear`, another `Sequential`), or a function of the input alone (`dx.relu`).
    Parameters are named `<index>.<name>`, the index being the layer's position."""

    layers: tuple

    def __init__(self, *layers):
        for i, layer in enumerate(layers):
            if not callable(layer):
                raise GraphError(f"Sequential: layer {i} is a {type(layer).__name__}, not a "
                                 "layer or a function")
        object.__setattr__(self, "layers", tuple(layers))

    def init(self, seed: int = 0) -> dict[str, Tensor]:
        out = {}
        for i, layer in enumerate(self.layers):
            if hasattr(layer, "init"):
                for name, t in layer.init(random.derive_seed(seed, i)).items():
                    out[f"{i}.{name}"] = t
        return out

    def __call__(self, params: Params, x) -> Tensor:
        unknown = set(params) - {f"{i}.{n}" for i, layer in enumerate(self.layers)
                                 if hasattr(layer, "init") for n in _names(layer)}
        if unknown:
            raise GraphError(f"Sequential: parameters {', '.join(sorted(map(shown, unknown)))} "
                             "belong to no layer")
        for i, layer in enumerate(self.layers):
            if hasattr(layer, "init"):
                prefix = f"{i}."
                x = layer({k[len(prefix):]: v for k, v in params.items()
                           if k.startswith(prefix)}, x)
            else:
                x = layer(x)
        return x


def _check_sizes(layer, *names: str) -> None:
    """The layer's sizes `names` are positive integers, or a GraphError naming the one not."""
    for name in names:
        value = getattr(layer, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GraphError(f"{type(layer).__name__}: {name} must be a positive integer, got "
                             f"{shown(value)}")


def _names(layer) -> list[str]:
    if isinstance(layer, Linear):
        return ["weight", "bias"] if layer.bias else ["weight"]
    if isinstance(layer, Embedding):
        return ["weight"]
    return list(layer.init(0))


def _param(params: Params, name: str, shape: tuple[int, ...]) -> Tensor:
    if name not in params:
        raise GraphError(f"missing parameter {shown(name)} (given: "
                         f"{', '.join(map(shown, params)) or 'none'})")
    t = as_tensor(params[name])
    if t.shape != shape:
        raise GraphError(f"parameter {shown(name)} has shape {t.shape}, the layer needs "
                         f"{shape}", t.node.id)
    return t


