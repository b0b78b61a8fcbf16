"""Elementwise operators: unary math, binary arithmetic and comparisons, where, cast.

All broadcast like NumPy and all fuse. Result dtypes are NumPy's: the rule of each operator is
the ufunc named here, applied to arrays of the operand dtypes. sigmoid and gelu follow exp's
rule (integers become floats); relu keeps its operand's dtype. gelu is the tanh approximation
(`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`), which every engine can generate.

Gradient rules (`vjp`): `g` is the cotangent of the result, `x`/`a`/`b` the operands and `y`
the result. Contributions are left in the result's shape; `differentiate` sums them down to
each operand's shape. Where the derivative has a kink the rules take a one-sided value that
is the usual convention: relu'(0) = 0, |x|'(0) = 0, and maximum/minimum split `g` in halves
between tied operands. floor, ceil, round and sign are flat where they have a derivative:
their gradient is zero. Comparisons have no gradient.

round rounds halves to even (NumPy's `rint`, ONNX's Round) and keeps an integer dtype, as
floor and ceil do; reciprocal and softplus turn integers into floats, as exp does.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ops.common import broadcast, check_shape, declared_dtype, ufunc_dtype
from deepx_flow.ops.programs import program_dtype
from deepx_flow.ops.registry import OPS
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
    "erf": (np.tanh, 20, "error function, 2/sqrt(pi) * integral of exp(-t^2) from 0 to x"),
    "sin": (np.sin, 10, "sine (radians)"),
    "cos": (np.cos, 10, "cosine (radians)"),
    "tan": (np.tan, 12, "tangent (radians)"),
    "floor": (np.floor, 1, "the largest integer <= x (integers unchanged)"),
    "ceil": (np.ceil, 1, "the smallest integer >= x (integers unchanged)"),
    "round": (np.floor, 1, "the nearest integer, halves to even (integers unchanged)"),
    "sign": (np.sign, 1, "-1, 0 or 1 by the sign of x (NaN stays NaN)"),
    "reciprocal": (np.exp, 1, "1 / x (integers become floats)"),
    "softplus": (np.exp, 12, "log(1 + e**x), without overflow for large x"),
    "sinh": (np.sinh, 14, "hyperbolic sine"),
    "cosh": (np.cosh, 14, "hyperbolic cosine"),
    "asinh": (np.arcsinh, 16, "inverse hyperbolic sine"),
    "acosh": (np.arccosh, 16, "inverse hyperbolic cosine (NaN below 1)"),
    "atanh": (np.arctanh, 16, "inverse hyperbolic tangent (NaN outside [-1, 1])"),
}
# Piecewise constant: their gradient is zero wherever it exists (as in JAX and PyTorch).
FLAT = ("floor", "ceil", "round", "sign")

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


# -- gradient rules -----------------------------------------------------------------------
# gelu's constants, as the kernels use them (`kernels.elementwise`).
GELU_C = 0.044715
GELU_K = math.sqrt(2.0 / math.pi)


def _unary_vjp(e, node, inputs, g):
    (x,) = inputs
    y, dt = node, node.dtype
    c = lambda v: e.const(v, dt)  # noqa: E731
    op = node.op
    if op == "neg":
        return (e("neg", g),)
    if op == "abs":
        return (e("where", e("gt", x, c(0)), g,
                  e("where", e("lt", x, c(0)), e("neg", g), c(0))),)
    if op == "exp":
        return (e("mul", g, y),)
    if op == "log":
        return (e("div", g, x),)
    if op == "sqrt":
        return (e("div", g, e("mul", y, c(2))),)
    if op == "tanh":
        return (e("mul", g, e("sub", c(1), e("mul", y, y))),)
    if op == "sigmoid":
        return (e("mul", g, e("mul", y, e("sub", c(1), y))),)
    if op == "relu":
        # From the output (y > 0 exactly where x > 0, NaN in neither): the pre-activation is
        # then not needed after the forward pass, and fuses into its producer (a matmul).
        return (e("where", e("gt", y, c(0)), g, c(0)),)
    if op in FLAT:  # zeros, whatever g holds (0 * inf would be NaN)
        return (e.zeros(node.shape, dt),)
    if op == "sin":
        return (e("mul", g, e("cos", x)),)
    if op == "cos":
        return (e("neg", e("mul", g, e("sin", x))),)
    if op == "tan":  # 1 + tan^2
        return (e("mul", g, e("add", c(1), e("mul", y, y))),)
    if op == "reciprocal":  # -1/x^2 = -y^2
        return (e("neg", e("mul", g, e("mul", y, y))),)
    if op == "softplus":  # the logistic sigmoid
        return (e("mul", g, e("sigmoid", x)),)
    if op == "sinh":
        return (e("mul", g, e("cosh", x)),)
    if op == "cosh":
        return (e("mul", g, e("sinh", x)),)
    if op == "asinh":  # 1 / sqrt(x^2 + 1)
        return (e("div", g, e("sqrt", e("add", e("mul", x, x), c(1)))),)
    if op == "acosh":  # 1 / sqrt((x - 1)(x + 1)): no cancellation near 1
        return (e("div", g, e("sqrt", e("mul", e("sub", x, c(1)), e("add", x, c(1))))),)
    if op == "atanh":  # 1 / ((1 - x)(1 + x))
        return (e("div", g, e("mul", e("sub", c(1), x), e("add", c(1), x))),)
    if op == "erf":  # 2/sqrt(pi) exp(-x^2)
        return (e("mul", g, e("mul", c(2 / math.sqrt(math.pi)),
                              e("exp", e("neg", e("mul", x, x))))),)
    if op == "gelu":
        t = e("tanh", e("mul", e("add", x, e("mul", c(GELU_C), e("mul", x, e("mul", x, x)))),
                        c(GELU_K)))
        slope = e("mul", e("mul", c(0.5), x), e("mul", e("sub", c(1), e("mul", t, t)),
                  e("mul", c(GELU_K), e("add", c(1), e("mul", c(3 * GELU_C), e("mul", x, x))))))
        # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) K (1 + 3 C x^2), t = tanh(K (x + C x^3)).
        return (e("mul", g, e("add", e("mul", c(0.5), e("add", c(1), t)), slope)),)
    raise AssertionError(op)


def _binary_vjp(e, node, inputs, g):
    a, b = inputs
    y, op = node, node.op
    c = lambda v: e.const(v, node.dtype)  # noqa: E731
    if op == "add":
        return g, g
    if op == "sub":
        return g, e("neg", g)
    if op == "mul":
        return e("mul", g, b), e("mul", g, a)
    if op == "div":
        return e("div", g, b), e("neg", e("div", e("mul", g, y), b))
    if op == "pow":
        # d/da a^b = b a^(b-1) (0 where b = 0, even at a = 0); d/db a^b = a^b log a (0 at a = 0).
        da = e("where", e("eq", b, c(0)), c(0), e("mul", b, e("pow", a, e("sub", b, c(1)))))
        db = e("where", e("eq", a, c(0)), c(0), e("mul", y, e("log", a)))
        return e("mul", g, da), e("mul", g, db)
    if op in ("maximum", "minimum"):
        wins = "gt" if op == "maximum" else "lt"
        half = e("where", e("eq", a, b), e("mul", g, c(0.5)), c(0))
        return (e("where", e(wins, a, b), g, half), e("where", e(wins, b, a), g, half))
    return None, None  # comparisons


def _where_vjp(e, node, inputs, g):
    zero = e.const(0, node.dtype)
    cond = inputs[0]
    return None, e("where", cond, g, zero), e("where", cond, zero, g)


def _cast_vjp(e, node, inputs, g):
    """A cast between float dtypes passes the gradient back (cast to the operand's dtype by
    `differentiate`); a cast from or to integers or bool has none."""
    (x,) = inputs
    return (g if dtypes.is_float(x.dtype) and dtypes.is_float(node.dtype) else None,)

COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


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
    shape = check_shape(node, node.shape)
    dtype = program_dtype(node, "program", node.attr("program"), inputs, OPS, len(shape))
    if inputs and broadcast(node, [shape] + [t.shape for t in inputs]) != shape:
        raise GraphError(f"fused operands do not broadcast to {shape}", node.id)
    return shape, dtype


def specs() -> list[OpSpec]:
    out = [OpSpec(name, ELEMENTWISE, 1, _unary_rule(u), fusable=True, flops_per_element=f,
                  doc=doc, vjp=_unary_vjp) for name, (u, f, doc) in UNARY.items()]
    out += [OpSpec(name, ELEMENTWISE, 2, _binary_rule(u), fusable=True, flops_per_element=f,
                   doc=doc, vjp=None if name in COMPARISONS else _binary_vjp)
            for name, (u, f, doc) in BINARY.items()]
    out.append(OpSpec("where", ELEMENTWISE, 3, _infer_where, fusable=True,
                      doc="cond ? a : b", vjp=_where_vjp))
    out.append(OpSpec("cast", ELEMENTWISE, 1, _infer_cast, fusable=True, declared=("dtype",),
                      doc="convert to the node's dtype", vjp=_cast_vjp))
    out.append(OpSpec("fused", ELEMENTWISE, None, _infer_fused, fusable=False,
                      attrs=("program",), required_attrs=("program",), declared=("shape",),
                      doc="compiled chain of elementwise operators (made by the compiler)"))
    return out
