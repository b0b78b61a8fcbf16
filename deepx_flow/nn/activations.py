"""Activations beyond the graph's own operators, composed of them (as ONNX defines each).

Each is a few elementwise nodes, so it fuses into one pass with what surrounds it and is
differentiated through its parts. Constants are computed in the operand's dtype (a Python
float is a "weak" scalar). NaN stays NaN in every one of them: each selects with a
comparison that NaN fails toward keeping `x` (`where(x < 0, f(x), x)`), never toward a
constant. (ONNX Runtime's ThresholdedRelu gives 0 for NaN; this gives NaN.)

Where a function has a kink, its derivative there is the one-sided value of the branch that
`where` picks, as for `relu`.
"""

from __future__ import annotations

import math
import numbers

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.sdk import functions as F
from deepx_flow.sdk.tensor import Tensor, as_tensor

# SELU's constants as ONNX's defaults give them: the paper's, rounded to float32.
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def _number(fn: str, name: str, value, positive: bool = False) -> float:
    """A finite real number argument (`positive`: also > 0), or a GraphError naming it."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        math.isfinite(value) and (value > 0 or not positive)
    if not ok:
        want = "a positive finite number" if positive else "a finite number"
        raise GraphError(f"{fn}: {name} must be {want}, got {shown(value)}")
    return float(value)


def _floating(fn: str, x) -> Tensor:
    x = as_tensor(x)
    if not dtypes.is_float(x.dtype):
        raise GraphError(f"{fn} applies to floating-point tensors, got {x.dtype}; cast it "
                         "first (dx.cast(x, 'float32'))", x.node.id)
    return x


def gelu(x, approximate: bool = False) -> Tensor:
    """GELU: `x * P(X <= x)` for a standard normal X, exactly `0.5 x (1 + erf(x / sqrt 2))`
    (PyTorch's and ONNX's default), or with `approximate=True` the tanh approximation
    (`dx.gelu`, JAX's default)."""
    x = as_tensor(x)
    if approximate:
        return F.gelu(x)
    return 0.5 * x * (1.0 + F.erf(x * (1.0 / math.sqrt(2.0))))


def leaky_relu(x, alpha: float = 0.01) -> Tensor:
    """`x` where x >= 0, else `alpha * x` (ONNX's LeakyRelu, PyTorch's default slope); NaN
    stays NaN."""
    x = as_tensor(x)
    alpha = _number("leaky_relu", "alpha", alpha)
    return F.where(x < 0, x * alpha, x)


def prelu(x, slope) -> Tensor:
    """`x` where x >= 0, else `slope * x`, with a learned `slope` tensor that broadcasts to
    `x` (ONNX's PRelu: one slope per channel is shape (C, 1, 1) for NCHW)."""
    x = as_tensor(x)
    slope = as_tensor(slope, x)
    y = F.where(x < 0, x * slope, x)
    if tuple(y.shape) != tuple(x.shape):  # the slope may not widen x
        raise GraphError(f"prelu: the slope's shape {tuple(slope.shape)} does not broadcast "
                         f"to the input's {tuple(x.shape)}")
    return y


def elu(x, alpha: float = 1.0) -> Tensor:
    """`x` where x >= 0, else `alpha * (e**x - 1)` (ONNX's Elu)."""
    x = _floating("elu", x)
    alpha = _number("elu", "alpha", alpha)
    return F.where(x < 0, (F.exp(x) - 1.0) * alpha, x)


def selu(x, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA) -> Tensor:
    """`gamma * x` where x > 0, else `gamma * (alpha * e**x - alpha)` (ONNX's Selu, with
    its default constants)."""
    x = _floating("selu", x)
    alpha, gamma = _number("selu", "alpha", alpha), _number("selu", "gamma", gamma)
    return F.where(x <= 0, (F.exp(x) * alpha - alpha) * gamma, x * gamma)


def celu(x, alpha: float = 1.0) -> Tensor:
    """`max(0, x) + min(0, alpha * (e**(x / alpha) - 1))` (ONNX's Celu), written as the
    branch each side takes."""
    x = _floating("celu", x)
    alpha = _number("celu", "alpha", alpha, positive=True)
    return F.where(x < 0, (F.exp(x * (1.0 / alpha)) - 1.0) * alpha, x)


def thresholded_relu(x, alpha: float = 1.0) -> Tensor:
    """`x` where x > alpha, else 0 (ONNX's ThresholdedRelu); NaN stays NaN."""
    x = as_tensor(x)
    alpha = _number("thresholded_relu", "alpha", alpha)
    return F.where(x <= alpha, 0.0, x)


def hard_sigmoid(x, alpha: float = 0.2, beta: float = 0.5) -> Tensor:
    """`max(0, min(1, alpha * x + beta))` (ONNX's HardSigmoid, with its defaults)."""
    x = _floating("hard_sigmoid", x)
    alpha = _number("hard_sigmoid", "alpha", alpha)
    beta = _number("hard_sigmoid", "beta", beta)
    return F.clip(x * alpha + beta, 0.0, 1.0)


def hard_swish(x) -> Tensor:
    """`x * hard_sigmoid(x, 1/6, 0.5)` (ONNX's HardSwish, MobileNetV3's activation)."""
    x = _floating("hard_swish", x)
    return x * hard_sigmoid(x, 1.0 / 6.0, 0.5)


def mish(x) -> Tensor:
    """`x * tanh(softplus(x))` (ONNX's Mish)."""
    x = _floating("mish", x)
    return x * F.tanh(F.softplus(x))
