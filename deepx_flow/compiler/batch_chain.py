"""Which nodes run as one chain over blocks of images: a convolutional network's layers.

A *batch chain* is a region of nodes that treat the rows of axis 0 (the images of a batch)
independently: convolution and pooling (`WINDOW`), elementwise kernels whose other operands
do not vary along axis 0 (biases, scales), reductions along other axes (a global pooling),
a reshape that keeps axis 0 (a flatten), softmax along another axis, and a 2-D matmul by a
whole weight matrix. Every reader of a member is in the region, so a member's value never
leaves its task; the region may branch and join again inside (a residual sum, a
squeeze-and-excitation scale, a hard-swish reading its input twice). The lowering gives the
chain one task per chunk of images (`kernels.batch_chain`), which runs a block of a few
dozen images through every layer while they are in cache; the layers' activations (a conv's
output is 8 to 16 times its input) are never written to memory as chunks of their own, nor
are they tasks and scheduler round trips of their own.

`batch_chains(graph, part)` maps each chain member but the last to the last (the node whose
tasks compute the chain), as `inline.chained_matmuls` does for the layers of an MLP. A chain
holds at least one WINDOW node (chains of matmuls alone are `chained_matmuls`'), and its
members share their chunks along axis 0 with every other axis in one chunk
(`partition` joins their batch axes), so a task holds whole images. Its task reads its
chunk of each image operand from outside the chain (the images; a skip connection from an
earlier layer) and every other operand whole. A chain's task holds those, its result, the
layers' weights and one block's activations; where that would not fit the partition's
budget, the first layers are left out of the chain (`images_per_block` says how many images
a block holds).
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.compiler.costs import main_cost
from deepx_flow.compiler.inline import chained_matmuls
from deepx_flow.ir import Graph, Node, dtypes
from deepx_flow.ir.program import whole_axes
from deepx_flow.ops import AXIS_WHOLE, ELEMENTWISE, MATMUL, REDUCE, WINDOW, get_op


def batch_chains(graph: Graph, part) -> dict[str, str]:
    """Chain member id -> the id of the chain's last node; see the module docstring."""
    users = graph.consumers()
    outputs = {node_id for _, node_id in graph.outputs}
    local = {n.id: _row_local(n, graph, part) for n in graph.nodes}
    chained: dict[str, str] = {}
    for node in reversed(graph.nodes):  # readers first: the chain of each reader is known
        readers = users[node.id]
        if node.id in outputs or not readers or not local[node.id]:
            continue
        ends = {chained.get(r, r) for r in readers}
        if len(ends) == 1 and all(
                local[r] and _reads_images_only(graph[r], node.id, graph)
                and part.chunks[node.id][0] == part.chunks[r][0] for r in readers):
            chained[node.id] = ends.pop()
    chains: dict[str, str] = {}
    for end in set(chained.values()):
        members = stages(graph[end], graph, chained)
        # From the front, the layers whose chain would not fit a task are tasks of their own
        while len(members) > 1 and images_per_block(members, graph, part) is None:
            members = members[1:]
        if any(get_op(n.op).kind == WINDOW for n in members) and len(members) > 1:
            chains.update({m.id: end for m in members[:-1]})
    return chains


def _reads_images_only(reader: Node, node_id: str, graph: Graph) -> bool:
    """Whether `reader` reads `node_id` only as one of its image operands."""
    images = image_operands(reader, graph)
    return all(k in images for k, src in enumerate(reader.inputs) if src == node_id)


# The largest activation of one block of images (measured on 8,192 28x28 images through
# conv(1->8), max_pool, relu, conv(8->16), max_pool, relu, gemm on a 2-core EPYC, one
# thread: blocks of 32 to 64 images, 0.8 to 1.6 MB of the first conv's output, ran fastest,
# 0.18 s a chunk against 0.29 s for the layers as whole-chunk kernels).
BLOCK_BYTES = 1 << 20
# But at least this many images a block: each stage costs 10 to 20 us of Python a block, which
# images larger than the cache (MobileNet's 224 x 224 layers, 800 KB an image) must share
# (bench_inference's MobileNetV3 on 2 workers, ONNX Runtime's images/s: 0.75x with one
# image a block, 0.95x with 2, 1.01x to 1.10x with 4, 0.96x with 8, 0.86x with 16).
MIN_BLOCK_IMAGES = 4


def images_per_block(members: list[Node], graph: Graph, part) -> int | None:
    """How many images a chain's task runs through its layers at a time: blocks of about
    BLOCK_BYTES of the largest activation (at least MIN_BLOCK_IMAGES), fewer where the
    task's chunk of images, its result and a block's working set (each layer's, as a task
    of a block) would not fit the partition's budget; None where one image does not."""
    held, per_image = _held_and_per_image(members, graph, part)
    image_bytes = max(math.prod(m.shape[1:]) * dtypes.itemsize(m.dtype) for m in members)
    room = (part.budget - held) // max(1, per_image)
    if room < 1:
        return None
    return int(min(room, max(MIN_BLOCK_IMAGES, BLOCK_BYTES // max(1, image_bytes)),
                   max(1, max(part.chunks[members[-1].id][0]))))


def working_set(members: list[Node], graph: Graph, part) -> int:
    """The bytes a chain's task holds: its images, result and weights, and one block's
    working set (of a chain that fits: `batch_chains` forms no other)."""
    held, per_image = _held_and_per_image(members, graph, part)
    return held + images_per_block(members, graph, part) * per_image


def _held_and_per_image(members: list[Node], graph: Graph, part) -> tuple[int, int]:
    """(the bytes a chain's task holds whatever its block: its chunks of images, its result
    and the other operands, whole; what each image of a block adds: every layer's working
    set on one image, summed, as each layer keeps its buffers from block to block)."""
    images = chain_inputs(members, graph)
    inside = {n.id for n in members} | set(images)
    rows = max(part.chunks[members[-1].id][0])  # the task's images, whatever their chunks
    held = sum(rows * math.prod(graph[i].shape[1:]) * dtypes.itemsize(graph[i].dtype)
               for i in images) + chunk_bytes(members[-1], part) \
        + sum(graph[i].size * dtypes.itemsize(graph[i].dtype)
              for i in {i for m in members for i in m.inputs} - inside)
    return held, sum(_one_image_cost(m, graph) for m in members)


def chain_inputs(members: list[Node], graph: Graph) -> list[str]:
    """The image operands a chain reads from outside it, in the order its members first read
    them: its task's chunks of images (`kernels.batch_chain`)."""
    inside = {m.id for m in members}
    out: list[str] = []
    for m in members:
        for k in image_operands(m, graph):
            src = m.inputs[k]
            if src not in inside and src not in out:
                out.append(src)
    return out


def chunk_bytes(node: Node, part) -> int:
    """Bytes of the node's largest chunk."""
    return math.prod(max(c) if c else 0 for c in part.chunks[node.id]) * \
        dtypes.itemsize(node.dtype)


def _one_image_cost(node: Node, graph: Graph) -> int:
    """The working set of `node` as a task of one image (its other operands whole)."""
    ins = [graph[i] for i in node.inputs]
    batch = {node.id} | {node.inputs[k] for k in image_operands(node, graph)}

    def chunk_of(node_id):
        shape = graph[node_id].shape
        return (1,) + shape[1:] if node_id in batch else shape
    kind = get_op(node.op).kind
    k = ins[0].shape[-1] if kind == MATMUL else None
    space = (1,) + reduced_space(node, graph)[1:] if kind == REDUCE else None
    return main_cost(node, ins, chunk_of, space, k).working_set


def reduced_space(node: Node, graph: Graph) -> tuple[int, ...]:
    """The shape a reduction reduces: its operands broadcast together (its prologue's)."""
    return tuple(np.broadcast_shapes(*(graph[i].shape for i in node.inputs)))


def all_chains(graph: Graph, part) -> tuple[dict[str, str], dict[str, str]]:
    """(batch chains, matmul chains): member id -> the id of the node whose tasks compute
    it. A matmul in a batch chain is a layer of that chain, not of a matmul chain."""
    batch = batch_chains(graph, part)
    return batch, chained_matmuls(graph, part, exclude=set(batch) | set(batch.values()))


def stages(last: Node, graph: Graph, chained: dict[str, str]) -> list[Node]:
    """The nodes of the chain ending at `last`, in the graph's order (each after the
    members it reads), `last` at the end."""
    return [n for n in graph.nodes if chained.get(n.id) == last.id] + [last]


def image_operands(node: Node, graph: Graph) -> list[int]:
    """The positions of `node`'s operands that hold images (vary along axis 0 with its
    result): the first of a WINDOW, MATMUL, REDUCE, softmax or reshape node; those of an
    elementwise kernel with the result's rank and batch size (its images, and per-image
    values such as a squeeze-and-excitation's scales); the others are whole, constant along
    axis 0. With one image in the batch, only `chain_operand` is (a bias is one image too),
    so such chains do not branch: a batch of one gains little from blocks of images."""
    if not node.inputs:
        return []
    if get_op(node.op).kind != ELEMENTWISE:
        return [0]
    if node.ndim < 1 or node.shape[0] < 2:
        at = chain_operand(node, graph)
        return [] if at is None else [at]
    return [k for k, src in enumerate(node.inputs)
            if graph[src].ndim == node.ndim and graph[src].shape[0] == node.shape[0]]


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
    """Whether `node` computes each row of axis 0 from that row of its image operands alone,
    with its other operands whole and constant along axis 0, chunked along axis 0 only."""
    kind = get_op(node.op).kind
    chunks = part.chunks[node.id]
    if node.ndim < 2 or any(len(c) != 1 for c in chunks[1:]):
        return False
    ins = [graph[i] for i in node.inputs]
    images = image_operands(node, graph)
    if not images or any(ins[k].ndim < 1 for k in images):
        return False
    if kind == WINDOW:
        return all(len(c) == 1 for t in ins[1:] for c in part.chunks[t.id])
    if kind == ELEMENTWISE:
        # (a fused softmax normalizes along an axis: across images, or across channels laid
        # out channels first; the chain's own softmax stage handles the one it can)
        return not whole_axes(node.attr("program"))
    if kind == REDUCE:  # along other axes than the images', in one partial per chunk
        prologue = node.attr("prologue")
        space = part.spaces.get(node.id)
        return (0 not in node.attr("axes") and node.attr("keepdims", False)
                and len(ins[0].shape) == node.ndim and space is not None
                and all(len(c) == 1 for c in space[1:])
                and (prologue is None or not whole_axes(prologue))
                and all(t.ndim < node.ndim or t.shape[0] == 1 for t in ins[1:]))
    if kind == AXIS_WHOLE:
        return node.attr("axis") % node.ndim != 0
    if kind == MATMUL:
        a, b, extras = ins[0], ins[1], ins[2:]
        return (node.ndim == 2 and a.ndim == 2 and b.ndim == 2
                and len(part.k_chunks[node.id]) == 1
                and all(len(c) == 1 for c in part.chunks[b.id])
                and all(t.ndim < 2 or t.shape[0] == 1 for t in extras))
    return node.op == "reshape" and ins[0].shape[0] == node.shape[0] > 1
