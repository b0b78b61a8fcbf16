"""Pass: take a max pooling's maxima before the elementwise kernel it reads.

Before: a fused graph. After: an equal graph in which `max_pool(f(x, c...))`, where the
elementwise kernel `f` is read by that pooling alone, is `f(max_pool(x), c...)` whenever
that gives the same numbers exactly, so `f` runs on the pooled values: a quarter of them for
a 2x2 pooling. A convolutional layer `max_pool(relu(conv(x, w) + b))` is the common case:
the bias and the ReLU then cost a quarter as much.

Why it is exact: every instruction of `f` that reads `x` is non-decreasing in it, and
rounds: `fl(a + c)`, `fl(a - c)`, `max(a, c)`, `min(a, c)`, `relu(a)`, `fl(a * k)` and
`fl(a / k)` for a constant k > 0, floor, ceil and round. Rounding to nearest is itself
non-decreasing, so such an `f` maps the largest value of a window to the largest of its
images: max(f(a), f(b)) = f(max(a, b)) in floating point, not only in real numbers. Its other
operands `c` must be constant over the pooling's window (1 along every spatial axis:
per-channel biases, scalars). NaN propagates through both forms alike; padding is never the
maximum of a window (every window holds data: `ops.window`). Functions that are increasing in
real numbers but not correctly rounded (exp, tanh, sigmoid) could break a tie the other way
and are left alone.
"""

from __future__ import annotations

from dataclasses import replace

from deepx_flow.compiler.infer import new_node
from deepx_flow.ir import Graph, Node
from deepx_flow.ops import ELEMENTWISE, get_op

# Operators non-decreasing in the operands at these positions (when the others do not
# depend on the pooled values); `None`: in every operand.
_NON_DECREASING = {"add": None, "maximum": None, "minimum": None, "sub": (0,), "relu": (0,),
                   "floor": (0,), "ceil": (0,), "round": (0,)}
_BY_POSITIVE_CONSTANT = {"mul": None, "div": (0,)}


def pool_first(graph: Graph) -> Graph:
    """The graph with max poolings moved ahead of the kernels they read; see the module
    docstring."""
    users = graph.consumers()
    outputs = {node_id for _, node_id in graph.outputs}
    nodes = {n.id: n for n in graph.nodes}
    order: list[str] = [n.id for n in graph.nodes]
    for pool in graph.nodes:
        if pool.op != "max_pool":
            continue
        kernel = nodes[pool.inputs[0]]
        at = _pooled_operand(kernel, graph, users, outputs)
        if at is None:
            continue
        x = graph[kernel.inputs[at]]
        attrs = dict(pool.attrs)
        pooled = new_node("max_pool", [x], **attrs)
        if pooled.id in nodes:
            continue  # the graph pools x so already: left as it is (rare, and simpler)
        # the kernel takes the pooling's id, so its readers and the outputs still find it
        nodes[pool.id] = replace(kernel, id=pool.id, shape=pool.shape, inputs=tuple(
            pooled.id if i == at else src for i, src in enumerate(kernel.inputs)))
        nodes[pooled.id] = pooled
        order[order.index(kernel.id)] = pooled.id
        del nodes[kernel.id]
    if len(nodes) == len(graph.nodes) and all(nodes.get(n.id) is n for n in graph.nodes):
        return graph
    return graph.replace([nodes[i] for i in order])


def _pooled_operand(kernel: Node, graph: Graph, users, outputs) -> int | None:
    """The operand position of `x` if the pooling reading `kernel` may run on `x` first."""
    if get_op(kernel.op).kind != ELEMENTWISE or kernel.id in outputs or \
            len(users[kernel.id]) != 1 or kernel.ndim < 3:
        return None
    full = [i for i, src in enumerate(kernel.inputs) if graph[src].shape == kernel.shape]
    if len(full) != 1 or list(kernel.inputs).count(kernel.inputs[full[0]]) != 1:
        return None
    at = full[0]
    spatial = kernel.ndim - 2
    for i, src in enumerate(kernel.inputs):
        shape = graph[src].shape
        if i != at and any(d != 1 for d in shape[max(0, len(shape) - spatial):]):
            return None  # varies inside a window
    x = graph[kernel.inputs[at]]
    program = kernel.attr("program") or (
        (kernel.op, tuple(("in", i) for i in range(len(kernel.inputs))), kernel.dtype),)
    return at if _non_decreasing(program, at, x.dtype) else None


def _non_decreasing(program, at: int, dtype: str) -> bool:
    """Whether every instruction reading input `at` (directly or through others) is one of
    the rounded, non-decreasing forms the module docstring lists, in `dtype` throughout."""
    depends: list[bool] = []
    for op, args, out_dtype in program:
        reads = [(a[0] == "in" and a[1] == at) or (a[0] == "t" and depends[a[1]])
                 for a in args]
        depends.append(any(reads))
        if not any(reads):
            continue
        if out_dtype != dtype:
            return False
        positions = [k for k, r in enumerate(reads) if r]
        if op in _NON_DECREASING:
            allowed = _NON_DECREASING[op]
        elif op in _BY_POSITIVE_CONSTANT and all(
                a[0] == "c" and a[1] > 0 for k, a in enumerate(args) if not reads[k]):
            allowed = _BY_POSITIVE_CONSTANT[op]
            if len(positions) > 1:
                return False  # a * a is not non-decreasing
        else:
            return False
        if allowed is not None and any(k not in allowed for k in positions):
            return False
    return depends[-1] if depends else False
