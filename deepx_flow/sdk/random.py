"""Counter-based random tensors: `dx.random.normal` and `dx.random.uniform`.

An element's value depends only on (seed, flat element index), so a tensor is the same
whatever its chunk grid and however many workers compute it.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import no_attribute
from deepx_flow.ir import dtypes
from deepx_flow.sdk.functions import _shape
from deepx_flow.sdk.tensor import Tensor, apply

__all__ = ["normal", "uniform", "derive_seed"]


def normal(shape, seed: int = 0, mean: float = 0.0, std: float = 1.0,
           dtype="float32") -> Tensor:
    """Normal values with the given mean and standard deviation."""
    return apply("random_normal", [], shape=_shape(shape), dtype=dtypes.normalize(dtype),
                 seed=seed, mean=_float(mean), std=_float(std))


def uniform(shape, seed: int = 0, low: float = 0.0, high: float = 1.0,
            dtype="float32") -> Tensor:
    """Uniform values in [low, high)."""
    return apply("random_uniform", [], shape=_shape(shape), dtype=dtypes.normalize(dtype),
                 seed=seed, low=_float(low), high=_float(high))


def derive_seed(seed: int, *path: int) -> int:
    """A seed in [0, 2**63) from `seed` and a path of integers (a layer's index, a training
    step): SplitMix64's mixing applied along the path, so nearby paths give unrelated
    streams and the same path always gives the same one."""
    for value in (seed, *path):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            from deepx_flow.errors import GraphError
            raise GraphError(f"seeds and their paths are non-negative integers, got {value!r}")
    mask = 2**64 - 1
    state = int(seed) & mask
    for value in path:
        state = (state ^ (int(value) * 0x9E3779B97F4A7C15)) & mask
        state = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        state = ((state ^ (state >> 27)) * 0x94D049BB133111EB) & mask
        state ^= state >> 31
    return state >> 1 if path else int(seed)


def _float(value):
    """Parameters are stored as floats (so `mean=0` and `mean=0.0` make one node); what is
    not a real number is left for the operator's rule to refuse by name."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)):
        try:
            return float(value)
        except OverflowError:
            return value
    return value


def __getattr__(name: str):
    raise no_attribute("dx.random", name, __all__)
