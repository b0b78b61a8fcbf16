"""The built-in operators, keyed by name.

`OPS` (`ops/registry.py`) is the table the compiler, the YAML reader and `deepx-flow ops`
consult, filled here. Third-party engines add operators through the registry
(`deepx_flow.registry.operators`).
"""

from __future__ import annotations

from deepx_flow.ops import (elementwise, gather, layout, linalg, reductions, scan, scatter,
                            sources, window)
from deepx_flow.ops.registry import OPS, get_op
from deepx_flow.ops.spec import (AXIS_WHOLE, ELEMENTWISE, GATHER, INDEXED, LAYOUT, MATMUL,
                                 REDUCE, SCAN, SOURCE, WINDOW, OpSpec)

OPS.update({spec.name: spec
            for module in (sources, elementwise, linalg, reductions, scan, layout, gather,
                           window, scatter)
            for spec in module.specs()})


__all__ = ["OPS", "OpSpec", "get_op", "SOURCE", "ELEMENTWISE", "MATMUL", "REDUCE", "AXIS_WHOLE",
           "LAYOUT", "GATHER", "WINDOW", "INDEXED", "SCAN"]
