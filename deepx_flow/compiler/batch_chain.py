"""Which nodes run as one chain over blocks of images: a convolutional network's layers.

A *batch chain* is a run of nodes, each the one reader of the one before, that treat the
rows of axis 0 (the images of a batch) independently: convolution and pooling (`WINDOW`),
elementwise kernels whose other operands do not vary along axis 0 (biases, scales), a
reshape that keeps axis 0 (a flatten), softmax along another axis, and a 2-D matmul by a
whole weight matrix. The lowering gives the chain one task per chunk of images
(`kernels.batch_chain`), which runs a block of a few dozen images through every layer while
they are in cache; the layers' activations (a conv's output is 8 to 16 times its input) are
never written to memory as chunks of their own, nor are they tasks and scheduler round trips
of their own.

`batch_chains(graph, part)` maps each chain member but the last to the last (the node whose
tasks compute the chain), as `inline.chained_matmuls` does for the layers of an MLP. A chain
holds at least one WINDOW node (chains of matmuls alone are `chained_matmuls`'), and its
members share their chunks along axis 0 with every other axis in one chunk
(`partition` joins their batch axes), so a task holds whole images. A chain's task holds
its chunk of images, its result, the layers' weights and one block's activations; where
that would not fit the partition's budget, the first layers are left out of the chain
(`images_per_block` says how many images a block holds).
"""

from __future__ import annotations

import math

from deepx_flow.compiler.costs import main_cost
from deepx_flow.compiler.inline import chained_matmuls
from deepx_flow.ir import Graph, Node, dtypes
from deepx_flow.ir.program import whole_axes
from deepx_flow.ops import AXIS_WHOLE, ELEMENTWISE, MATMUL, WINDOW, get_op


def batch_chains(graph: Graph, part) -> dict[str, str]:
    """Chain member id -> the id of the chain's last node; see the module docstring."""
    users = graph.consumers()
    outputs = {node_id for _, node_id in graph.outputs}
    chained: dict[str, str] = {}
    has_window: dict[str, bool] = {}  # chain end -> whether a WINDOW node is in its chain
    for node in reversed(graph.nodes):  # readers first: a chain's end is known
        readers = users[node.id]
        if node.id in outputs or len(readers) != 1 or not _row_local(node, graph, part):
            continue
        reader = graph[readers[0]]
        at = chain_operand(reader, graph)
        if not (at is not None and reader.inputs[at] == node.id
                and _row_local(reader, graph, part)
                and part.chunks[node.id][0] == part.chunks[reader.id][0]):
            continue
        end = chained.get(reader.id, reader.id)
        chained[node.id] = end
        has_window[end] = has_window.get(end, False) or any(
            get_op(n.op).kind == WINDOW for n in (node, reader))
    chains: dict[str, str] = {}
    for end in {e for e, window in has_window.items() if window}:
        members = stages(graph[end], graph, chained)
        # From the front, the layers whose chain would not fit a task are tasks of their own
        while len(members) > 1 and images_per_block(members, graph, part) is None:
            members = members[1:]
        if any(get_op(n.op).kind == WINDOW for n in members) and len(members) > 1:
            chains.update({m.id: end for m in members[:-1]})
    return chains


# The largest activation of one block of images (measured on 8,192 28x28 images through
# conv(1->8), max_pool, relu, conv(8->16), max_pool, relu, gemm on a 2-core EPYC, one
# thread: blocks of 32 to 64 images, 0.8 to 1.6 MB of the first conv's output, ran fastest,
# 0.18 s a chunk against 0.29 s for the layers as whole-chunk kernels).
BLOCK_BYTES = 1 << 20


def images_per_block(members: list[Node], graph: Graph, part) -> int | None:
    """How many images a chain's task runs through its layers at a time: blocks of about
    BLOCK_BYTES of the largest activation, fewer where the task's chunk of images, its
    result and a block's working set (each layer's, as a task of a block) would not fit the
    partition's budget; None where one image does not."""
    held, per_image = _held_and_per_image(members, graph, part)
    image_bytes = max(math.prod(m.shape[1:]) * dtypes.itemsize(m.dtype) for m in members)
    room = (part.budget - held) // max(1, per_image)
    if room < 1:
        return None
    return int(min(room, max(1, BLOCK_BYTES // max(1, image_bytes)),
                   max(1, max(part.chunks[members[-1].id][0]))))


def working_set(members: list[Node], graph: Graph, part) -> int:
    """The bytes a chain's task holds: its images, result and weights, and one block's
    working set (of a chain that fits: `batch_chains` forms no other)."""
    held, per_image = _held_and_per_image(members, graph, part)
    return held + images_per_block(members, graph, part) * per_image


def _held_and_per_image(members: list[Node], graph: Graph, part) -> tuple[int, int]:
    """(the bytes a chain's task holds whatever its block: its chunk of images, its result
    and the other operands, whole; what each image of a block adds: every layer's working
    set on one image, summed, as each layer keeps its buffers from block to block)."""
    first, last = members[0], members[-1]
    x = graph[first.inputs[chain_operand(first, graph)]]
    inside = {n.id for n in members} | {x.id}
    held = chunk_bytes(x, part) + chunk_bytes(last, part) + sum(
        graph[i].size * dtypes.itemsize(graph[i].dtype)
        for i in {i for m in members for i in m.inputs} - inside)
    return held, sum(_one_image_cost(m, graph) for m in members)


def chunk_bytes(node: Node, part) -> int:
    """Bytes of the node's largest chunk."""
    return math.prod(max(c) if c else 0 for c in part.chunks[node.id]) * \
        dtypes.itemsize(node.dtype)


def _one_image_cost(node: Node, graph: Graph) -> int:
    """The working set of `node` as a task of one image (its other operands whole)."""
    ins = [graph[i] for i in node.inputs]
    batch = {node.id, node.inputs[chain_operand(node, graph)]}

    def chunk_of(node_id):
        shape = graph[node_id].shape
        return (1,) + shape[1:] if node_id in batch else shape
    k = ins[0].shape[-1] if get_op(node.op).kind == MATMUL else None
    return main_cost(node, ins, chunk_of, None, k).working_set


def all_chains(graph: Graph, part) -> tuple[dict[str, str], dict[str, str]]:
    """(batch chains, matmul chains): member id -> the id of the node whose tasks compute
    it. A matmul in a batch chain is a layer of that chain, not of a matmul chain."""
    batch = batch_chains(graph, part)
    return batch, chained_matmuls(graph, part, exclude=set(batch) | set(batch.values()))


def stages(last: Node, graph: Graph, chained: dict[str, str]) -> list[Node]:
    """The nodes of the chain ending at `last`, first to last."""
    out = [last]
    while (source := out[0].inputs[chain_operand(out[0], graph)]) in chained:
        out.insert(0, graph[source])
    return out


def chain_operand(node: Node, graph: Graph) -> int | None:
    """The position of the operand that carries the images through `node`: the first, or
    for an elementwise kernel the one operand of the result's shape, read once (None when
    there is not exactly one)."""
    if not node.inputs:
        return None
    if get_op(node.op).kind != ELEMENTWISE:
        return 0
    full = [i for i, src in enumerate(node.inputs)
            if graph[src].shape == node.shape and list(node.inputs).count(src) == 1]
    return full[0] if len(full) == 1 else None


def _row_local(node: Node, graph: Graph, part) -> bool:
    """Whether `node` computes each row of axis 0 from that row of its chain operand alone,
    with its other operands whole and constant along axis 0, chunked along axis 0 only."""
    kind = get_op(node.op).kind
    chunks = part.chunks[node.id]
    if node.ndim < 2 or any(len(c) != 1 for c in chunks[1:]):
        return False
    ins = [graph[i] for i in node.inputs]
    at = chain_operand(node, graph)
    if at is None or ins[at].ndim < 1:
        return False
    if kind == WINDOW:
        return all(len(c) == 1 for t in ins[1:] for c in part.chunks[t.id])
    if kind == ELEMENTWISE:
        # (a fused softmax normalizes along an axis: across images, or across channels laid
        # out channels first; the chain's own softmax stage handles the one it can)
        return not whole_axes(node.attr("program")) and all(
            t.ndim < node.ndim or t.shape[0] == 1 for i, t in enumerate(ins) if i != at)
    if kind == AXIS_WHOLE:
        return node.attr("axis") % node.ndim != 0
    if kind == MATMUL:
        a, b, extras = ins[0], ins[1], ins[2:]
        return (node.ndim == 2 and a.ndim == 2 and b.ndim == 2
                and len(part.k_chunks[node.id]) == 1
                and all(len(c) == 1 for c in part.chunks[b.id])
                and all(t.ndim < 2 or t.shape[0] == 1 for t in extras))
    return node.op == "reshape" and ins[0].shape[0] == node.shape[0] > 1
