"""Counter-based random tensors: `dx.random.normal` and `dx.random.uniform`.

An element's value depends only on (seed, flat element index), so a tensor is the same
whatever its chunk grid and however many workers compute it.
"""

from __future__ import annotations

from deepx_flow.ir import dtypes
from deepx_flow.sdk.functions import _shape
from deepx_flow.sdk.tensor import Tensor, apply


def normal(shape, seed: int = 0, mean: float = 0.0, std: float = 1.0,
           dtype="float32") -> Tensor:
    """Normal values with the given mean and standard deviation."""
    return apply("random_normal", [], shape=_shape(shape), dtype=dtypes.normalize(dtype),
                 seed=seed, mean=float(mean), std=float(std))


def uniform(shape, seed: int = 0, low: float = 0.0, high: float = 1.0,
            dtype="float32") -> Tensor:
    """Uniform values in [low, high)."""
    return apply("random_uniform", [], shape=_shape(shape), dtype=dtypes.normalize(dtype),
                 seed=seed, low=float(low), high=float(high))
