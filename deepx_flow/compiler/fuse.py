"""Pass: fuse chains of elementwise operators into single kernels.

Before: a validated, typed graph.
After: an equal computation in which
  * every elementwise operator belongs to a `fused` node whose `program` attribute lists its
    operations (see `deepx_flow.ir.program`), exactly one but for the cheap operators
    recomputed in several kernels (below); elementwise nodes whose users all
    belong to one kernel, and which are not outputs, join that kernel, which keeps the id of
    its root so its users and the outputs still find it;
  * scalar constants (`full` of shape ()) are inlined into programs as literals;
  * a softmax or log_softmax whose users are all in one kernel of its own shape joins that
    kernel as a whole-axis instruction (`ir.program`), if the kernel normalizes along no other
    axis: the normalized values are then never stored, and a softmax and a log_softmax of one
    value share their maximum and normalizer; a softmax read only by a reduction becomes a
    kernel of its own, and so the reduction's prologue;
  * a cheap elementwise operator (one flop per element) that several kernels read, whose
    operands are small or stored for another reader anyway, is computed inside each of those
    kernels instead of being stored: `x - mean` read by a variance and a third moment costs
    the same reads of `x` either way, and is then never written;
  * a `fused` node that reads a matmul result of the same shape, used nowhere else, becomes the
    matmul's `epilogue` (the product is `in0`; the other operands follow `a` and `b`), unless
    it holds a whole-axis instruction;
  * a `fused` node read only by a reduction becomes the reduction's `prologue`, so the
    elementwise result is never stored: each partial reduction evaluates it chunk by chunk.
Nodes are never fused across an output, and into kernels of several users only as above, so
nothing costly is computed twice.
"""

from __future__ import annotations

from dataclasses import replace

from deepx_flow.ir import Graph, Node
from deepx_flow.ir.node import make_attrs
from deepx_flow.ir.program import (WHOLE_AXIS_OPS, const_ref, input_ref, temp_ref,
                                   whole_axes, whole_axis_ref)
from deepx_flow.ops import ELEMENTWISE, MATMUL, REDUCE, get_op


def _is_elementwise(node: Node) -> bool:
    return get_op(node.op).kind == ELEMENTWISE and node.op != "fused"


def _is_whole_axis(node: Node) -> bool:
    return node.op in WHOLE_AXIS_OPS


def _is_scalar_const(node: Node) -> bool:
    return node.op == "full" and node.shape == ()


def _recomputed(node: Node, graph: Graph, users, kernels: set, outputs: set) -> bool:
    """Whether an elementwise node read by several kernels is computed in each of them: it
    costs one flop per element, and reading its operands there reads no more than reading
    it would (each is small next to it, a scalar, an output or read by another node too), so
    recomputing it only saves writing it and a task per chunk."""
    if node.id in outputs or len(kernels) < 2 or None in kernels or \
            get_op(node.op).flops_per_element > 1:
        return False
    for src in node.inputs:
        operand = graph[src]
        if not (_is_scalar_const(operand) or 8 * operand.size <= node.size
                or len(set(users[src])) > 1 or src in outputs):
            return False
    return True


def _build_program(root: Node, graph: Graph, absorbed: set[str]):
    """The program of the tree under `root`, and the ids of the tree's external inputs.

    Instructions come in depth-first post-order (operands left to right before their user),
    and each absorbed node is computed once however often it is read. The walk keeps its own
    stack: a chain of 10,000 operators is 10,000 levels deep, far past Python's recursion
    limit.
    """
    program: list = []
    inputs: list[str] = []
    done: dict[str, tuple] = {}

    def leaf(node_id: str) -> tuple | None:
        """The reference of a node that is not an instruction, or None for one that is."""
        node = graph[node_id]
        if _is_scalar_const(node):
            return const_ref(node.attr("value"), node.dtype)
        if node_id in absorbed:
            return None
        inputs.append(node_id)
        return input_ref(len(inputs) - 1)

    # Each frame is (node, index of the next operand to look at); the root itself is always an
    # instruction, even when it reads only inputs.
    stack: list[list] = [[root, 0]]
    while stack:
        frame = stack[-1]
        node, k = frame
        if k < len(node.inputs):
            frame[1] = k + 1
            src = node.inputs[k]
            if src not in done:
                ref = leaf(src)
                if ref is None:
                    stack.append([graph[src], 0])
                else:
                    done[src] = ref
            continue
        stack.pop()
        args = tuple(done[i] for i in node.inputs)
        if _is_whole_axis(node):
            args += (whole_axis_ref(node.attr("axis")),)
        program.append((node.op, args, node.dtype))
        done[node.id] = temp_ref(len(program) - 1)
    return tuple(program), inputs


def fuse_elementwise(graph: Graph, join_softmax: bool = True) -> Graph:
    """Group elementwise trees into `fused` nodes, then into matmul epilogues and reduction
    prologues; see the module docstring for what holds after. With `join_softmax` False,
    softmaxes stay nodes of their own (the compiler's fallback when a fused one's whole axis
    makes a plan that cannot fit)."""
    users = graph.consumers()
    outputs = set(graph.output_ids)

    # An elementwise node joins its users' kernel when it is not an output and all its users
    # are elementwise and in one kernel (`t * t`, or `t` read twice further down the chain):
    # the program then computes it once and reads the result twice. Users come before their
    # operands in reverse order, so their kernels are known when a node is looked at.
    # A softmax joins the same way, but only a kernel of its shape (its axis is then an axis of
    # the kernel's space, kept whole in each chunk) that normalizes along no other axis (two
    # whole axes would make the chunks larger). It starts a kernel of its own only to become
    # the prologue of the one reduction that reads it.
    root: dict[str, str] = {}
    kernel_axis: dict[str, int] = {}
    for n in reversed(graph.nodes):
        whole = join_softmax and _is_whole_axis(n)
        if not (whole or _is_elementwise(n)):
            continue
        kernels = {root.get(u) for u in users[n.id]}
        joins = n.id not in outputs and len(kernels) == 1 and None not in kernels
        if joins and whole:
            kernel = next(iter(kernels))
            joins = (graph[kernel].shape == n.shape and
                     kernel_axis.setdefault(kernel, n.attr("axis")) == n.attr("axis"))
        if joins:
            root[n.id] = kernels.pop()
        elif not whole and _recomputed(n, graph, users, kernels, outputs):
            root[n.id] = None  # in each of its users' kernels; its operands join none
        elif not whole or (n.id not in outputs and len(users[n.id]) == 1 and
                           get_op(graph[users[n.id][0]].op).kind == REDUCE):
            root[n.id] = n.id
            if whole:
                kernel_axis[n.id] = n.attr("axis")
    absorbed = {node_id for node_id, r in root.items() if r != node_id}
    inlined = {n.id for n in graph.nodes if _is_scalar_const(n) and n.id not in outputs
               and all(_is_elementwise(graph[u]) for u in users[n.id])}

    new_nodes: dict[str, Node] = {}
    for node in graph.nodes:
        if node.id in absorbed or node.id in inlined:
            continue
        if _is_elementwise(node) or node.id in root:
            program, ins = _build_program(node, graph, absorbed)
            # The program is frozen already (its constants come from frozen attributes):
            # freezing it again walked every instruction of a 20,000-node chain.
            node = Node(node.id, "fused", tuple(ins), node.shape, node.dtype,
                        (("program", program),))
        new_nodes[node.id] = node
    fused = Graph(tuple(new_nodes.values()), graph.outputs)
    return _merge_into_neighbours(fused)


def _merge_into_neighbours(graph: Graph) -> Graph:
    users = graph.consumers()
    outputs = set(graph.output_ids)
    replaced: dict[str, Node] = {}   # node id -> its replacement
    dropped: set[str] = set()

    for node in graph.nodes:
        if node.op != "fused":
            continue
        program = node.attr("program")
        # Epilogue: the fused node reads a same-shaped matmul that nobody else uses.
        for k, src in enumerate(node.inputs):
            prod = graph[src]
            if (get_op(prod.op).kind == MATMUL and prod.attr("epilogue") is None
                    and not whole_axes(program) and src not in outputs and len(users[src]) == 1
                    and prod.shape == node.shape and src not in dropped):
                order = [k] + [i for i in range(len(node.inputs)) if i != k]
                program = _renumber(program, order)
                extra = tuple(node.inputs[i] for i in order[1:])
                attrs = dict(prod.attrs)
                attrs["epilogue"] = program
                replaced[node.id] = Node(node.id, prod.op, prod.inputs + extra, node.shape,
                                         node.dtype, make_attrs(**attrs))
                dropped.add(src)
                break

    for node in graph.nodes:
        # Prologue: a reduction whose only input is a fused node used nowhere else.
        if get_op(node.op).kind != REDUCE or node.attr("prologue") is not None:
            continue
        (src,) = node.inputs
        prod = replaced.get(src, graph[src])
        if prod.op == "fused" and src not in outputs and len(users[src]) == 1:
            attrs = dict(node.attrs)
            attrs["prologue"] = prod.attr("program")
            replaced[node.id] = replace(node, inputs=prod.inputs, attrs=make_attrs(**attrs))
            dropped.add(src)

    nodes = [replaced.get(n.id, n) for n in graph.nodes if n.id not in dropped]
    return Graph(tuple(nodes), graph.outputs)


def _renumber(program, order: list[int]):
    """Rewrite input references so that old input `order[i]` becomes input `i`."""
    new_index = {old: new for new, old in enumerate(order)}

    def fix(arg):
        return ("in", new_index[arg[1]]) if arg[0] == "in" else arg

    return tuple((op, tuple(fix(a) for a in args), dtype) for op, args, dtype in program)
