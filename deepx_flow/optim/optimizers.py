"""Optimizers as update graphs on parameter and state tensors.

An optimizer is configuration only. `init(params)` gives its state tensors (zeros, one per
parameter and slot); `scalars(step)` gives the numbers that change from step to step (the
scheduled learning rate, Adam's bias corrections), computed on the driver in float64; and
`update(params, grads, state, scalars)` builds the graph of one step from tensors, the
scalars included as 0-d tensors. So one compiled step serves every step, and the same code
runs a step on one worker or many.

The formulas are those of PyTorch's `torch.optim` (no dampening, no centered RMSProp, no
AMSGrad): with `g` the gradient, after clipping by the global norm when `clip_norm` is set,

    SGD       g += wd p;  b = mu b + g;  d = g + mu b (Nesterov) or b (momentum) or g;
              p -= lr d
    Adam      g += wd p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
              p -= (lr / c1) m / (sqrt(v) / sqrt(c2) + eps),  c1 = 1 - b1^t, c2 = 1 - b2^t
    AdamW     p *= 1 - lr wd; then Adam's step without wd
    RMSProp   g += wd p;  v = a v + (1 - a) g^2;  d = g / (sqrt(v) + eps);
              b = mu b + d and p -= lr b (with momentum), else p -= lr d

Clipping (PyTorch's clip_grad_norm_): n = sqrt(sum of every g^2); g *= min(1, clip / (n + 1e-6)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.common import flag
from deepx_flow.optim.schedules import Constant, check_number
from deepx_flow.sdk import functions as F
from deepx_flow.sdk.tensor import Tensor

Tensors = Mapping[str, Tensor]


@dataclass(frozen=True)
class Update:
    """What one step builds: the new parameters and state, and the gradients' global norm
    (before clipping)."""

    params: dict[str, Tensor]
    state: dict[str, dict[str, Tensor]]
    grad_norm: Tensor


class Optimizer:
    """The shared parts: the schedule, weight decay, clipping and the step's scalars."""

    slots: tuple[str, ...] = ()

    def init(self, params: Tensors) -> dict[str, dict[str, Tensor]]:
        """Zero state: `{slot: {parameter name: tensor}}`."""
        return {slot: {name: F.zeros(p.shape, p.dtype) for name, p in params.items()}
                for slot in self.slots}

    def scalars(self, step: int) -> dict[str, float]:
        """The numbers of step `step` (counted from 1)."""
        if not isinstance(step, int) or step < 1:
            raise GraphError(f"optimizer steps count from 1, got {shown(step)}")
        return {"lr": self.lr * self.schedule.factor(step)}

    def update(self, params: Tensors, grads: Tensors, state, scalars: Tensors) -> Update:
        """The graph of one step (see the module docstring)."""
        _check(params, grads)
        norm = global_norm(grads)
        if self.clip_norm is not None:
            grads = clip(grads, norm, self.clip_norm)
        new_params, new_state = {}, {slot: {} for slot in self.slots}
        for name, p in params.items():
            s = {k: _cast(v, p.dtype) for k, v in scalars.items()}
            slots = {slot: state[slot][name] for slot in self.slots}
            new_params[name], changed = self._step(p, grads[name].astype(p.dtype), slots, s)
            for slot, value in changed.items():
                new_state[slot][name] = value
        return Update(new_params, new_state, norm)

    def _check_common(self, **ranges):
        """The hyperparameters every optimizer has, and those of `ranges` (name -> the
        keyword arguments of `check_number`; default: a number >= 0)."""
        owner = type(self).__name__
        for name in ("lr", "weight_decay", *ranges):
            check_number(owner, name, getattr(self, name), **ranges.get(name, {}))
        if self.clip_norm is not None:
            check_number(owner, "clip_norm (or None)", self.clip_norm, above=True)
        if not hasattr(self.schedule, "factor"):
            raise GraphError(f"{type(self).__name__}: schedule must be a schedule "
                             f"(dx.optim.Cosine, ...), got {shown(self.schedule)}")


@dataclass(frozen=True)
class SGD(Optimizer):
    lr: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    clip_norm: float | None = None
    schedule: object = field(default_factory=Constant)

    def __post_init__(self):
        self._check_common(momentum={})
        if flag(self.nesterov, "SGD: nesterov") and self.momentum <= 0:
            raise GraphError("SGD: Nesterov momentum needs momentum > 0")

    @property
    def slots(self):
        return ("momentum",) if self.momentum else ()

    def _step(self, p, g, slots, s):
        if self.weight_decay:
            g = g + self.weight_decay * p
        if not self.momentum:
            return p - s["lr"] * g, {}
        b = self.momentum * slots["momentum"] + g
        d = g + self.momentum * b if self.nesterov else b
        return p - s["lr"] * d, {"momentum": b}


@dataclass(frozen=True)
class Adam(Optimizer):
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float | None = None
    schedule: object = field(default_factory=Constant)
    decoupled = False  # AdamW decays the parameters instead of the gradient
    slots = ("m", "v")

    def __post_init__(self):
        self._check_common(eps={})
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise GraphError(f"{type(self).__name__}: betas must be a pair (b1, b2), got "
                             f"{shown(self.betas)}")
        for name, value in zip(("betas[0]", "betas[1]"), self.betas):
            check_number(type(self).__name__, name, value, 0, 1, below=True)

    def scalars(self, step: int) -> dict[str, float]:
        b1, b2 = self.betas
        return {**super().scalars(step), "c1": 1.0 - b1 ** step, "c2": 1.0 - b2 ** step}

    def _step(self, p, g, slots, s):
        b1, b2 = self.betas
        if self.weight_decay and self.decoupled:
            p = p * (1.0 - s["lr"] * self.weight_decay)
        elif self.weight_decay:
            g = g + self.weight_decay * p
        m = b1 * slots["m"] + (1.0 - b1) * g
        v = b2 * slots["v"] + (1.0 - b2) * (g * g)
        denom = F.sqrt(v) / F.sqrt(s["c2"]) + self.eps
        return p - (s["lr"] / s["c1"]) * m / denom, {"m": m, "v": v}


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as PyTorch's)."""

    weight_decay: float = 0.01
    decoupled = True


@dataclass(frozen=True)
class RMSProp(Optimizer):
    lr: float = 0.01
    alpha: float = 0.99
    eps: float = 1e-8
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = None
    schedule: object = field(default_factory=Constant)

    def __post_init__(self):
        self._check_common(alpha=dict(high=1), eps={}, momentum={})

    @property
    def slots(self):
        return ("v", "momentum") if self.momentum else ("v",)

    def _step(self, p, g, slots, s):
        if self.weight_decay:
            g = g + self.weight_decay * p
        v = self.alpha * slots["v"] + (1.0 - self.alpha) * (g * g)
        d = g / (F.sqrt(v) + self.eps)
        if not self.momentum:
            return p - s["lr"] * d, {"v": v}
        b = self.momentum * slots["momentum"] + d
        return p - s["lr"] * b, {"v": v, "momentum": b}


def global_norm(grads: Tensors) -> Tensor:
    """sqrt of the sum of every gradient element squared, in float64."""
    total = None
    for g in grads.values():
        g = g.astype("float64")
        part = (g * g).sum()
        total = part if total is None else total + part
    return F.sqrt(total)


def clip(grads: Tensors, norm: Tensor, max_norm: float) -> dict[str, Tensor]:
    """Gradients scaled by min(1, max_norm / (norm + 1e-6))."""
    coef = F.minimum(max_norm / (norm + 1e-6), 1.0)
    return {name: g * coef.astype(g.dtype) for name, g in grads.items()}


def _cast(value: Tensor, dtype: str) -> Tensor:
    return value if value.dtype == dtype else value.astype(dtype)


def _check(params: Tensors, grads: Tensors) -> None:
    if set(params) != set(grads):
        raise GraphError(f"the gradients' names {sorted(grads)} are not the parameters' "
                         f"{sorted(params)}")
    for name, p in params.items():
        if not dtypes.is_float(p.dtype):
            raise GraphError(f"parameter {shown(name)} is {p.dtype}; only floating-point "
                             "parameters are trained", p.node.id)
        if grads[name].shape != p.shape:
            raise GraphError(f"the gradient of {shown(name)} has shape {grads[name].shape}, "
                             f"the parameter {p.shape}", p.node.id)
