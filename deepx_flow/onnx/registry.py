"""The table of ONNX operators that convert (`SUPPORTED`: op key -> its converter, attributes,
family and doc) and of those refused with advice (`REFUSED`), which each converter module
fills with `_op`; and the converters' small helpers (a tensor or a constant as the values
a node gives, a constant input). `converters.py` imports every converter module, so that
the table is whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from deepx_flow.onnx.values import Context, Value


@dataclass(frozen=True)
class OnnxOp:
    """How one ONNX operator converts."""

    convert: Callable  # (ctx, node, args, attrs) -> list[Value]
    attrs: tuple[str, ...]
    family: str
    doc: str


SUPPORTED: dict[str, OnnxOp] = {}
# Operators refused with advice (op key -> why, and what to do instead).
REFUSED: dict[str, str] = {}


def _op(name: str, family: str, doc: str, attrs=()):
    def register(fn):
        SUPPORTED[name] = OnnxOp(fn, tuple(attrs), family, doc)
        return fn
    return register


def _t(tensor) -> list[Value]:
    return [Value(tensor=tensor)]


def _c(array) -> list[Value]:
    return [Value(const=np.asarray(array))]


def _const(ctx: Context, value: Value | None, what: str) -> np.ndarray:
    """A constant input (an initializer, a Constant node or a folded computation)."""
    if value is None or value.const is None:
        raise ctx.error(f"{what} must be a constant (an initializer or a Constant node), "
                        "not computed in the graph")
    return value.const
