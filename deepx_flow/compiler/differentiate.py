"""Pass: reverse-mode differentiation, which adds gradient nodes to a graph.

Before: a validated, typed graph as the SDK or a spec builds it (no compiled `fused` nodes,
prologues or epilogues: differentiate first, then compile), an output `of` with a
floating-point dtype, and the ids of the nodes to differentiate with respect to (`wrt`,
floating-point, typically the graph's parameter inputs).
After: the same graph with one more output per `wrt` node, named `grad_<id>`: the gradient of
`of` (scalar, or contracted with the `cotangent` node) with respect to that node, of its shape
and dtype. The gradient nodes are ordinary nodes (content-hash ids, as the SDK would make
them), so the result is fused, partitioned, written as YAML and run like any graph, and a
forward value the gradient needs (a softmax, a tanh) is the forward node itself, not a copy.

How: the cotangent of `of` is walked back through the nodes that lie on a path from a `wrt`
node to `of`, in reverse topological order. Each node's cotangent is the sum of what its users
sent it; its operator's vector-Jacobian rule (`OpSpec.vjp`, registered with the operator)
splits it among its operands, and each share is summed down to the operand's shape (the adjoint
of broadcasting) and cast to the operand's dtype.

Refused, with a GraphError naming the node: a `wrt` node that is not floating point; an `of`
that is not floating point, or not a scalar when no cotangent is given; a `wrt` node that
`of` does not depend on; a `wrt` node whose every path to `of` passes through an operator no
gradient passes through (a comparison, a cast to an integer): the error names that operator's
node.
"""

from __future__ import annotations

from typing import Sequence

from deepx_flow.compiler.emit import Emitter
from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import Graph, Node, dtypes
from deepx_flow.ops import get_op

COMPILED_ATTRS = ("program", "prologue", "epilogue")


def grad_output_name(node_id: str) -> str:
    """The output name `differentiate` gives the gradient with respect to `node_id`."""
    return f"grad_{node_id}"


def differentiate(graph: Graph, wrt: Sequence[str], of: str | None = None,
                  cotangent: str | None = None) -> Graph:
    """Add the gradients of output `of` with respect to the nodes `wrt`; see the module
    docstring.

    Parameters
    ----------
    graph : Graph
        A typed graph (`compiler.infer.infer_types`), before fusion.
    wrt : sequence of str
        Ids of the nodes to differentiate with respect to.
    of : str, optional
        The name of the output to differentiate; by default the graph's only output.
    cotangent : str, optional
        Id of a node of `of`'s shape and dtype to contract the Jacobian with (a vector-Jacobian
        product); required when `of` is not a scalar.

    Returns
    -------
    Graph
        `graph` with the outputs `grad_<id>` added, in the order of `wrt`.
    """
    out = _output(graph, of)
    wrt = list(dict.fromkeys(wrt))
    for node_id in wrt:
        _check_wrt(graph, node_id)
    emit = Emitter(graph.nodes)
    seed = _seed(emit, graph, out, cotangent)
    relevant = _between(graph, set(wrt), out.id)

    shares: dict[str, list[Node]] = {out.id: [seed]}
    blocked: dict[str, str] = {}  # node -> a node without gradient on its way to `of`
    total: dict[str, Node] = {}
    for node in reversed(graph.nodes):
        if node.id not in relevant:
            continue
        parents = [i for i, src in enumerate(node.inputs) if src in relevant]
        if node.id not in shares:  # every path from it to `of` is blocked
            # Name the operator where the values stopped being floats (a comparison, a cast
            # to an integer) rather than the one downstream that could not take them.
            stop = blocked[node.id] if dtypes.is_float(node.dtype) else node.id
            for i in parents:
                blocked.setdefault(node.inputs[i], stop)
            continue
        total[node.id] = g = _add_all(emit, shares[node.id])
        if not parents:
            continue
        compiled = [a for a in COMPILED_ATTRS if node.attr(a) is not None]
        if node.op == "fused" or compiled:
            raise GraphError(f"{node.op} with a compiled {compiled[0] if compiled else 'program'}"
                             ": differentiate the graph as built, before compiling it", node.id)
        ins = [graph[i] for i in node.inputs]
        rule = get_op(node.op).vjp
        results = rule(emit, node, ins, g) if rule else (None,) * len(ins)
        for i in parents:
            src, share = node.inputs[i], results[i]
            if share is None:
                blocked.setdefault(src, node.id)
                continue
            shares.setdefault(src, []).append(_fit(emit, share, graph[src]))

    outputs = list(graph.outputs)
    taken = {name for name, _ in outputs}
    for node_id in wrt:
        grad = total.get(node_id)
        if grad is None:
            _no_gradient(graph, node_id, out, blocked)
        name = grad_output_name(node_id)
        if name in taken:
            raise GraphError(f"the graph already has an output named {shown(name)}, the name of "
                             "this node's gradient", node_id)
        outputs.append((name, grad.id))
    return _reachable(Graph(tuple(graph.nodes) + tuple(emit.new), tuple(outputs)))


def _output(graph: Graph, of: str | None) -> Node:
    names = dict(graph.outputs)
    if of is None:
        if len(names) != 1:
            raise GraphError(f"the graph has {len(names)} outputs; name the one to "
                             f"differentiate (one of {', '.join(map(shown, names))})")
        (of,) = names
    if of not in names:
        raise GraphError(f"no output named {shown(of)} to differentiate")
    out = graph[names[of]]
    if not dtypes.is_float(out.dtype):
        raise GraphError(f"only floating-point results have gradients; {shown(of)} is "
                         f"{out.dtype}", out.id)
    return out


def _check_wrt(graph: Graph, node_id: str) -> None:
    if node_id not in graph:
        raise GraphError(f"cannot differentiate with respect to {shown(node_id)}: it is not "
                         "in the graph")
    node = graph[node_id]
    if not dtypes.is_float(node.dtype):
        raise GraphError(f"gradients are taken with respect to floating-point tensors; this "
                         f"one is {node.dtype}", node_id)


def _seed(emit: Emitter, graph: Graph, out: Node, cotangent: str | None) -> Node:
    """The cotangent of `of`: 1 for a scalar, else the given node."""
    if cotangent is None:
        if out.shape != ():
            raise GraphError(f"the result to differentiate has shape {out.shape}; a gradient "
                             "needs a scalar (sum or mean it) or a cotangent of that shape",
                             out.id)
        return emit.const(1, out.dtype)
    if cotangent not in graph:
        raise GraphError(f"the cotangent {shown(cotangent)} is not in the graph")
    seed = graph[cotangent]
    if seed.shape != out.shape or seed.dtype != out.dtype:
        raise GraphError(f"the cotangent is {seed.dtype}{seed.shape}, but the result it "
                         f"weights is {out.dtype}{out.shape}", cotangent)
    return seed


def _between(graph: Graph, starts: set[str], end: str) -> set[str]:
    """The nodes on some path from a node of `starts` to `end` (both included)."""
    after = set()
    for node in graph.nodes:
        if node.id in starts or any(i in after for i in node.inputs):
            after.add(node.id)
    before = {end}
    for node in reversed(graph.nodes):
        if node.id in before:
            before.update(node.inputs)
    return after & before


def _add_all(emit: Emitter, shares: list[Node]) -> Node:
    total = shares[0]
    for share in shares[1:]:
        total = emit("add", total, share)
    return total


def _fit(emit: Emitter, share: Node, operand: Node) -> Node:
    """An operand's share summed down to its shape and cast to its dtype."""
    share = emit.sum_to(share, operand.shape)
    if share.shape != operand.shape:
        raise GraphError(f"{operand.op}: the gradient rule gave shape {share.shape} for an "
                         f"operand of shape {operand.shape}", operand.id)
    return share if share.dtype == operand.dtype else emit("cast", share, dtype=operand.dtype)


def _no_gradient(graph: Graph, node_id: str, out: Node, blocked: dict[str, str]):
    if node_id in blocked:
        stop = graph[blocked[node_id]]
        raise GraphError(f"no gradient reaches {shown(node_id)}: every path from it to "
                         f"{shown(out.id)} passes through this {stop.op}, which has no "
                         "gradient (comparisons, integer casts and sources have none)",
                         stop.id)
    raise GraphError(f"{shown(out.id)} does not depend on this node, so it has no gradient "
                     "with respect to it", node_id)


def _reachable(graph: Graph) -> Graph:
    """The graph without nodes no output needs (shares of operands that need none)."""
    keep = set(graph.output_ids)
    for node in reversed(graph.nodes):
        if node.id in keep:
            keep.update(node.inputs)
    return graph.replace([n for n in graph.nodes if n.id in keep])
