"""Elementwise operators: unary math, binary arithmetic and comparisons, where, cast.

All broadcast like NumPy and all fuse. Result dtypes are NumPy's: the rule of each operator is
the ufunc named here, applied to arrays of the operand dtypes. sigmoid and gelu follow exp's
rule (integers become floats); relu keeps its operand's dtype. gelu is the tanh approximation
(`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`), which every engine can generate.
"""

from __future__ import annotations

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.common import broadcast, check_shape, declared_dtype, ufunc_dtype
from deepx_flow.ops.programs import program_dtype
from deepx_flow.ops.spec import ELEMENTWISE, OpSpec

# name: (ufunc giving the dtype rule, flops per element, doc)
UNARY = {
    "neg": (np.negative, 1, "-x"),
    "abs": (np.absolute, 1, "|x|"),
    "exp": (np.exp, 10, "e**x"),
    "log": (np.log, 10, "natural logarithm"),
    "sqrt": (np.sqrt, 4, "square root"),
    "tanh": (np.tanh, 12, "hyperbolic tangent"),
    "sigmoid": (np.exp, 12, "1 / (1 + e**-x)"),
    "relu": (np.positive, 1, "max(x, 0)"),
    "gelu": (np.tanh, 20, "GELU, tanh approximation"),
}

BINARY = {
    "add": (np.add, 1, "a + b"),
    "sub": (np.subtract, 1, "a - b"),
    "mul": (np.multiply, 1, "a * b"),
    "div": (np.true_divide, 1, "a / b (true division)"),
    "pow": (np.power, 10, "a ** b"),
    "maximum": (np.maximum, 1, "elementwise maximum (NaN propagates)"),
    "minimum": (np.minimum, 1, "elementwise minimum (NaN propagates)"),
    "lt": (np.less, 1, "a < b"),
    "le": (np.less_equal, 1, "a <= b"),
    "gt": (np.greater, 1, "a > b"),
    "ge": (np.greater_equal, 1, "a >= b"),
    "eq": (np.equal, 1, "a == b"),
    "ne": (np.not_equal, 1, "a != b"),
}


def _unary_rule(ufunc):
    def infer(node, inputs):
        (a,) = inputs
        if node.op == "relu" and a.dtype == "bool":
            raise GraphError("relu is not defined for dtype bool", node.id)
        return a.shape, ufunc_dtype(node, ufunc, [a.dtype])
    return infer


def _binary_rule(ufunc):
    def infer(node, inputs):
        a, b = inputs
        shape = broadcast(node, [a.shape, b.shape])
        return shape, ufunc_dtype(node, ufunc, [a.dtype, b.dtype])
    return infer


def _infer_where(node, inputs):
    cond, a, b = inputs
    if cond.dtype != "bool":
        raise GraphError(f"where: the condition {shown(cond.id)} must be bool, got {cond.dtype}; "
                         "compare it first (x > 0)", node.id)
    shape = broadcast(node, [cond.shape, a.shape, b.shape])
    return shape, dtypes.ufunc_result(np.add, a.dtype, b.dtype) if a.dtype != b.dtype \
        else a.dtype


def _infer_cast(node, inputs):
    (a,) = inputs
    return a.shape, declared_dtype(node)


def _infer_fused(node, inputs):
    """A compiled chain: the node states its shape; its checked program gives the dtype."""
    from deepx_flow.ops import OPS
    shape = check_shape(node, node.shape)
    dtype = program_dtype(node, "program", node.attr("program"), inputs, OPS, len(shape))
    if inputs and broadcast(node, [shape] + [t.shape for t in inputs]) != shape:
        raise GraphError(f"fused operands do not broadcast to {shape}", node.id)
    return shape, dtype


def specs() -> list[OpSpec]:
    out = [OpSpec(name, ELEMENTWISE, 1, _unary_rule(u), fusable=True, flops_per_element=f,
                  doc=doc) for name, (u, f, doc) in UNARY.items()]
    out += [OpSpec(name, ELEMENTWISE, 2, _binary_rule(u), fusable=True, flops_per_element=f,
                   doc=doc) for name, (u, f, doc) in BINARY.items()]
    out.append(OpSpec("where", ELEMENTWISE, 3, _infer_where, fusable=True,
                      doc="cond ? a : b"))
    out.append(OpSpec("cast", ELEMENTWISE, 1, _infer_cast, fusable=True, declared=("dtype",),
                      doc="convert to the node's dtype"))
    out.append(OpSpec("fused", ELEMENTWISE, None, _infer_fused, fusable=False,
                      attrs=("program",), required_attrs=("program",), declared=("shape",),
                      doc="compiled chain of elementwise operators (made by the compiler)"))
    return out
