"""The built-in operators, keyed by name.

`OPS` is the table the compiler, the YAML reader and `deepx-flow ops` consult. Third-party
engines add operators through the registry (`deepx_flow.registry.operators`).
"""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.ops import (elementwise, gather, layout, linalg, reductions, scan, scatter,
                            sources, window)
from deepx_flow.ops.spec import (AXIS_WHOLE, ELEMENTWISE, GATHER, INDEXED, LAYOUT, MATMUL,
                                 REDUCE, SCAN, SOURCE, WINDOW, OpSpec)

OPS: dict[str, OpSpec] = {
    spec.name: spec
    for module in (sources, elementwise, linalg, reductions, scan, layout, gather, window,
                   scatter)
    for spec in module.specs()
}


def get_op(name: str, node: str | None = None) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown operator {shown(name)} (see `deepx-flow ops` for the list)",
                         node) from None


__all__ = ["OPS", "OpSpec", "get_op", "SOURCE", "ELEMENTWISE", "MATMUL", "REDUCE", "AXIS_WHOLE",
           "LAYOUT", "GATHER", "WINDOW", "INDEXED", "SCAN"]
