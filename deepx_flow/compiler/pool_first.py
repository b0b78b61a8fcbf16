"""When a max pooling may take its maxima before the elementwise kernel it reads.

`max_pool(f(x, c...))` equals `f(max_pool(x), c...)` exactly, in floating point and not only
in real numbers, when `f` is non-decreasing in `x` and can make no NaN from a value that is
not NaN; `f` then runs on the pooled values, a quarter of them after a 2x2 pooling. (Equal
as numbers: a zero's sign may differ, as max_pool's own choice between -0.0 and +0.0
already depends on the order of its taps.) A
convolutional layer `max_pool(relu(conv(x, w) + b))` is the common case. A batch chain
(`kernels/batch_chain.py`) swaps the two where this says it may.

Why it is exact: rounding to nearest is non-decreasing, so `fl(a + c)`, `fl(a - c)`,
`max(a, c)`, `min(a, c)`, `relu(a)`, `fl(a * k)` and `fl(a / k)` (k > 0), floor, ceil and
round are non-decreasing in `a`; such an `f` maps the largest value of a window to the
largest of its images. NaN: `max` propagates it in both orders, as long as `f` makes none
itself. `a + c` makes NaN from -inf when `c` is +inf, so an added tensor `c` must be finite:
`commuting_operands` names those operands, and the chain checks them when it runs (a bias is
small) and keeps the order when one is not finite. For the same reason `a(x) + b(x)` of two
values that both depend on x is refused (one can overflow to +inf where the other reaches
-inf), and constants must be finite. Its other operands must be constant over the pooling's
window (1 along every spatial axis: per-channel biases, scalars); padding is never a window's
maximum (every window holds data: `ops.window`). Functions increasing in real numbers but
not correctly rounded (exp, tanh, sigmoid) could break a tie the other way and are refused.
Integers wrap around on overflow (int8 100 + 100 is -56), so for them only max, min, relu,
floor, ceil and round qualify.
"""

from __future__ import annotations

import math

from deepx_flow.ir import Graph, Node
from deepx_flow.ir.dtypes import is_float
from deepx_flow.ir.program import node_program
from deepx_flow.ops import ELEMENTWISE, get_op

_UNARY = ("relu", "floor", "ceil", "round")
_EITHER_ORDER = ("maximum", "minimum")  # never NaN from numbers: any operands
_PLUS = {"add": (0, 1), "sub": (0,)}  # positions x may take; the other operand is added
_TIMES = {"mul": (0, 1), "div": (0,)}  # ... and the other a positive finite constant


def commuting_operands(kernel: Node, at: int, graph: Graph) -> tuple[int, ...] | None:
    """None if a max pooling may not run before the elementwise `kernel` whose images are
    its operand `at`; else the positions of its operands that must hold finite values for it
    to (tensors added to the images)."""
    if get_op(kernel.op).kind != ELEMENTWISE or kernel.ndim < 3:
        return None
    x = graph[kernel.inputs[at]]
    spatial = kernel.ndim - 2
    for i, src in enumerate(kernel.inputs):
        shape = graph[src].shape
        if i != at and any(d != 1 for d in shape[max(0, len(shape) - spatial):]):
            return None  # varies inside a window
    return _finite_needed(node_program(kernel), at, x.dtype)


def _finite_needed(program, at: int, dtype: str) -> tuple[int, ...] | None:
    """The inputs that must be finite for every instruction reading input `at` (directly or
    through others) to be one of the module docstring's forms, in `dtype` throughout; None
    when one is not."""
    depends: list[bool] = []
    finite: set[int] = set()
    for op, args, out_dtype in program:
        reads = [(a[0] == "in" and a[1] == at) or (a[0] == "t" and depends[a[1]])
                 for a in args]
        depends.append(any(reads))
        if not any(reads):
            continue
        if out_dtype != dtype:
            return None
        positions = [k for k, r in enumerate(reads) if r]
        others = [a for a, r in zip(args, reads) if not r]
        if op in _UNARY or op in _EITHER_ORDER:
            continue
        if not is_float(dtype):
            return None  # integer arithmetic wraps around
        if len(positions) != 1 or len(others) != 1:
            return None
        (other,) = others
        if op in _PLUS and positions[0] in _PLUS[op]:
            if other[0] == "in":
                finite.add(other[1])
            elif not (other[0] == "c" and math.isfinite(other[1])):
                return None  # a value computed from others might not be finite
        elif not (op in _TIMES and positions[0] in _TIMES[op] and other[0] == "c"
                  and math.isfinite(other[1]) and other[1] > 0):
            return None
    return tuple(sorted(finite)) if depends and depends[-1] else None
