"""Counter-based random tensors: `dx.random.normal` and `dx.random.uniform`.

An element's value depends only on (seed, flat element index), so a tensor is the same
whatever its chunk grid and however many workers compute it.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.ir import dtypes
from deepx_flow.sdk.functions import _shape
from deepx_flow.sdk.tensor import Tensor, apply


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
