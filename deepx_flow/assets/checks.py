"""Asset checks: tests of a materialized tensor, computed on the cluster in the same graph.

A check has two halves. `measure` builds a small tensor graph on the asset's tensor (a
count of non-finite values, a min and a max, a user's reduction); those tensors are
compiled into the materialization's graph, so a check reads the chunks while they are in
memory and only a few numbers come back to the driver. `judge` turns those numbers (and the
asset's shape and dtype) into a verdict. A check with no `measure` (the shape check) costs
nothing on the cluster.

A failing blocking check (the default) stops the assets downstream of the one it checks in
that materialization, and its version is recorded but not used: `dx.load` and downstream
assets keep reading the newest version whose blocking checks passed. A non-blocking check
is recorded and warned about.

    @dx.asset(checks=[dx.checks.all_finite, dx.checks.in_range(-1, 1),
                      dx.checks.reduction(lambda t: t.mean(), lambda m: abs(m) < 0.1,
                                          name="mean_near_zero", blocking=False)])
    def embeddings(features, projection): ...
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from deepx_flow.errors import GraphError


@dataclass(frozen=True)
class Verdict:
    passed: bool
    value: float | None  # the number the check is about (a count, a min, a mean)
    message: str


@dataclass(frozen=True)
class Check:
    """One named check; `measure(tensor)` gives a Tensor, a tuple of Tensors or None, and
    `judge(values, shape, dtype)` a Verdict (values: NumPy scalars, as `measure` returned)."""

    name: str
    measure: Callable | None
    judge: Callable
    blocking: bool = True
    description: str = ""

    def non_blocking(self) -> "Check":
        """The same check, recorded and warned about but not stopping downstream assets."""
        return dataclasses.replace(self, blocking=False)


def _all_finite_measure(t):
    if not np.issubdtype(np.dtype(t.dtype), np.inexact):
        return None  # integers and booleans are always finite
    from deepx_flow.sdk.functions import abs as abs_, cast
    return cast(abs_(t) < np.inf, "int64").sum()  # NaN compares false too


def _all_finite_judge(values, shape, dtype) -> Verdict:
    size = math.prod(shape)
    bad = 0 if values is None else size - int(values)
    return Verdict(bad == 0, float(bad),
                   "all values are finite" if bad == 0 else
                   f"{bad} of {size} values are not finite (NaN or +-inf)")


all_finite = Check("all_finite", _all_finite_measure, _all_finite_judge,
                   description="no NaN or infinite values")


def in_range(low=None, high=None, *, blocking: bool = True, name: str | None = None) -> Check:
    """Every value is in [low, high] (either bound may be None). NaN is out of range."""
    if low is None and high is None:
        raise GraphError("dx.checks.in_range needs a low or a high bound")

    def measure(t):
        return None if math.prod(t.shape) == 0 else (t.min(), t.max())

    def judge(values, shape, dtype) -> Verdict:
        if values is None:
            return Verdict(True, None, "no values")
        lo, hi = (float(v) for v in values)
        below = math.isnan(lo) or (low is not None and lo < low)
        above = math.isnan(hi) or (high is not None and hi > high)
        span = f"values span [{lo:.6g}, {hi:.6g}]"
        if below or above:
            return Verdict(False, lo if below else hi, f"{span}, outside {bounds}")
        return Verdict(True, None, f"{span}, inside {bounds}")

    # (a missing bound as an infinity, numbers as the span's: "[0, inf]", not "[0.0, None]")
    lowest, highest = -math.inf if low is None else low, math.inf if high is None else high
    bounds = f"[{lowest:.6g}, {highest:.6g}]"
    return Check(name or "in_range", measure, judge, blocking, f"values in {bounds}")


def shape(expected, *, blocking: bool = True, name: str | None = None) -> Check:
    """The tensor has this shape (`None` matches any size along that axis)."""
    expected = tuple(expected)

    def judge(values, actual, dtype) -> Verdict:
        ok = len(actual) == len(expected) and all(
            e is None or e == a for e, a in zip(expected, actual))
        return Verdict(ok, None, f"shape {tuple(actual)}" + ("" if ok else
                                                             f", expected {expected}"))

    return Check(name or "shape", None, judge, blocking, f"shape {expected}")


def reduction(fn: Callable, predicate: Callable, *, name: str | None = None,
              blocking: bool = True) -> Check:
    """A custom check: `fn(tensor)` builds a scalar Tensor (a reduction), computed on the
    cluster; `predicate(value)` says whether that value passes."""
    label = name or getattr(fn, "__name__", "reduction")
    if label == "<lambda>":
        raise GraphError("dx.checks.reduction of a lambda needs name=...")

    def measure(t):
        out = fn(t)
        if getattr(out, "shape", None) != ():
            got = f"shape {out.shape}" if hasattr(out, "shape") else repr(out)
            raise GraphError(f"must build a scalar (a full reduction such as t.mean()), "
                             f"got {got}")
        return out

    def judge(values, shape, dtype) -> Verdict:
        value = float(values)
        ok = bool(predicate(value))
        return Verdict(ok, value, f"value {value:.6g}" + ("" if ok else " fails the check"))

    return Check(label, measure, judge, blocking, getattr(fn, "__doc__", None) or "")


def check_names(checks) -> list[str]:
    """The names of an asset's checks, refusing anything that is not a Check and repeats."""
    names = []
    for c in checks:
        if not isinstance(c, Check):
            raise GraphError(f"checks take dx.checks objects (all_finite, in_range(...), "
                             f"shape(...), reduction(...)), got {c!r}")
        if c.name in names:
            raise GraphError(f"two checks are named {c.name!r}; give one name=...")
        names.append(c.name)
    return names


__all__ = ["Check", "Verdict", "all_finite", "in_range", "shape", "reduction"]
