"""The table of operators by name, `OPS`, and `get_op`. The package (`ops/__init__.py`) fills
it with the built-in operators as it imports their modules, and third-party engines add
theirs (`deepx_flow.registry.operators`); an operator's rule that reads the table while it
runs (the type check of a compiled program: a fused chain, a matmul's epilogue, a
reduction's prologue) imports it from here, so no operator module imports the package."""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.ops.spec import OpSpec

OPS: dict[str, OpSpec] = {}


def get_op(name: str, node: str | None = None) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown operator {shown(name)} (see `deepx-flow ops` for the list)",
                         node) from None
