"""Learning-rate schedules: the factor the base learning rate is multiplied by at a step.

Steps count from 1 (the first update). A schedule is a small frozen value computed on the
driver, whose result enters the step's graph as a scalar input, so a schedule never changes
the compiled graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepx_flow.errors import GraphError, shown


def _positive_int(owner: str, name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GraphError(f"{owner}: {name} must be a positive integer, got {shown(value)}")


def check_number(owner: str, name: str, value, low: float = 0.0, high: float = math.inf, *,
                 above: bool = False, below: bool = False) -> None:
    """A GraphError naming `owner`'s `name` unless `value` is a finite number (an int or a
    float, not a bool) from `low` to `high` (excluded when `above` / `below`): what an
    optimizer's or a schedule's hyperparameter may be."""
    try:
        number = float(value) if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else math.nan
    except OverflowError:  # an int past any float
        number = math.inf
    if not (math.isfinite(number) and (number > low if above else number >= low)
            and (number < high if below else number <= high)):
        ends = f"{'>' if above else '>='} {low:g}" if high == math.inf else \
            f"in {'(' if above else '['}{low:g}, {high:g}{')' if below else ']'}"
        raise GraphError(f"{owner}: {name} must be a finite number {ends}, got "
                         f"{shown(value)}")


@dataclass(frozen=True)
class Constant:
    """The base learning rate at every step."""

    def factor(self, step: int) -> float:
        return 1.0


@dataclass(frozen=True)
class StepDecay:
    """Multiplied by `gamma` every `every` steps (PyTorch's StepLR)."""

    every: int
    gamma: float = 0.1

    def __post_init__(self):
        _positive_int("StepDecay", "every", self.every)
        check_number("StepDecay", "gamma", self.gamma)

    def factor(self, step: int) -> float:
        return self.gamma ** ((step - 1) // self.every)


@dataclass(frozen=True)
class Cosine:
    """From 1 down to `floor` along half a cosine over `total` steps, then `floor`
    (PyTorch's CosineAnnealingLR with eta_min = floor * lr)."""

    total: int
    floor: float = 0.0

    def __post_init__(self):
        _positive_int("Cosine", "total", self.total)
        check_number("Cosine", "floor", self.floor)

    def factor(self, step: int) -> float:
        done = min(step - 1, self.total)
        return self.floor + (1.0 - self.floor) * (1.0 + math.cos(math.pi * done / self.total)) / 2


@dataclass(frozen=True)
class Warmup:
    """Linear warm-up over `steps` steps (step k of them gets k / steps), then `then`,
    counted from the end of the warm-up."""

    steps: int
    then: object = Constant()

    def __post_init__(self):
        _positive_int("Warmup", "steps", self.steps)
        if not hasattr(self.then, "factor"):
            raise GraphError(f"Warmup: then must be a schedule, got {shown(self.then)}")

    def factor(self, step: int) -> float:
        if step <= self.steps:
            return step / self.steps
        return self.then.factor(step - self.steps)
