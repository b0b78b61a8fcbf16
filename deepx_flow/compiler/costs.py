"""The cost model of one task: working set, FLOPs and bytes, from chunk shapes.

The partitioner asks `working_set` whether a chunking fits the per-task budget; `plan.explain`
and the compute/communication estimate use `task_costs`. Shapes are the largest chunk of each
tensor (a regular grid's interior chunk), so the figures are per-task peaks. Operators bring
their own per-element figures (`OpSpec.flops_per_element`, `temp_bytes_per_element`).
"""

from __future__ import annotations

import math

import numpy as np
from dataclasses import dataclass, replace
from typing import Callable

from deepx_flow.ir import Node, dtypes
from deepx_flow.ir.program import whole_axes
from deepx_flow.kernels.scan import scratch_elements
from deepx_flow.ops import (AXIS_WHOLE, ELEMENTWISE, GATHER, INDEXED, LAYOUT, MATMUL, REDUCE,
                            SCAN, SOURCE, WINDOW, get_op)
from deepx_flow.ops.reductions import ACCUMULATED

ChunkOf = Callable[[str], tuple[int, ...]]


@dataclass(frozen=True)
class TaskCost:
    """Per-task figures for one kind of task of a node."""

    working_set: int   # bytes held while the task runs: operands, result, scratch
    flops: float
    bytes_in: int
    bytes_out: int


def _nbytes(shape, dtype: str) -> int:
    return math.prod(shape) * dtypes.itemsize(dtype)


def program_flops(program) -> float:
    return sum(get_op(op).flops_per_element for op, _, _ in program)


# Elements of the evaluators' reused block buffers (`kernels.fused_cpu.BLOCK_ELEMENTS`): below
# this a program's temporaries are negligible next to its chunks.
BLOCK_ELEMENTS = 1 << 18


def whole_axis_scratch(program, chunk) -> int:
    """Bytes a program's temporaries take when it holds whole-axis instructions: its blocks
    keep every axis from the first whole one on whole, so where those axes hold more than a
    block (a softmax along axis 0), each temporary, the normalizer's two buffers and its
    float64 sum are that large (8 bytes an element each, an upper bound)."""
    axes = whole_axes(program)
    if not axes:
        return 0
    block = math.prod(chunk[axes[0]:])
    return 8 * block * (len(program) + 3) if block > BLOCK_ELEMENTS else 0


def window_cost(node: Node, inputs: list[Node], chunk_of: ChunkOf, out_chunk, out_bytes
                ) -> TaskCost:
    """A block of images with every channel and the input positions the windows of the
    output chunk cover (and its pieces, when the input is chunked otherwise), the whole
    weights, the padded copy of the block, the im2col matrix of one group (a conv's) or one
    window view's reduction temporaries (a pool's), and the result."""
    x = inputs[0]
    n = out_chunk[0]
    item = dtypes.itemsize(x.dtype)
    spatial = x.ndim - 2
    pads = node.attr("pads") or (0,) * (2 * spatial)
    kernel = node.attr("kernel") or inputs[1].shape[2:]
    strides = node.attr("strides") or (1,) * spatial
    dilations = node.attr("dilations") or (1,) * spatial
    # the windows of `o` output positions span (o - 1) stride + dilation (k - 1) + 1 of
    # the padded input, at most the whole padded axis
    spans = [min((o - 1) * st + d * (k - 1) + 1, size + pads[a] + pads[spatial + a])
             for a, (o, st, d, k, size) in enumerate(zip(out_chunk[2:], strides, dilations,
                                                         kernel, x.shape[2:]))]
    region = tuple(min(span, size) for span, size in zip(spans, x.shape[2:]))
    block = n * x.shape[1] * math.prod(region) * item
    pieces = block if tuple(chunk_of(x.id)[1:]) != (x.shape[1],) + region else 0
    padded = n * x.shape[1] * math.prod(spans) * item
    out_positions = n * math.prod(out_chunk[2:])
    if node.op == "conv":
        w = inputs[1]
        groups = node.attr("groups", 1)
        window = math.prod(w.shape[1:])  # C / groups x the kernel
        weights = math.prod(w.shape) * item
        # one block of images' im2col matrix and product (kernels/window.py BLOCK_IMAGES)
        block_positions = min(n, 64) * math.prod(out_chunk[2:])
        columns = block_positions * window * item
        product = block_positions * (w.shape[0] // groups) * item
        flops = 2.0 * out_positions * w.shape[0] * window
        return TaskCost(block + pieces + padded + weights + columns + product + out_bytes,
                        flops, block + weights, out_bytes)
    window = math.prod(node.attr("kernel"))
    # max_pool keeps its running maximum in the result; avg_pool a float64 sum (divided in
    # place) before rounding it into the result.
    temps = 8 * math.prod(out_chunk) if node.op == "avg_pool" else 0
    return TaskCost(block + pieces + padded + temps + out_bytes,
                    float(math.prod(out_chunk) * window), block, out_bytes)


# Scratch per index a scatter or element gather reads (`kernels/scatter.py`): the index as
# int64 in range, its flat position, and the sort that picks the last of duplicate writes.
INDEX_SCRATCH_BYTES = 40


def indexed_cost(node: Node, inputs: list[Node], chunk_of: ChunkOf, out_chunk, out_bytes
                 ) -> TaskCost:
    """A scatter's or an element gather's task (its regions from the operator's `Tiling`,
    those of the first chunk, the largest of a regular grid): each operand region, twice
    where it is assembled from pieces of another chunking, the int64 scratch per index, and
    the result (a scatter's a copy of its block of x)."""
    region = tuple((0, c) for c in out_chunk)
    read = pieces = 0
    regions = get_op(node.op).tiling.regions(node, inputs, region)
    for at, (t, r) in enumerate(zip(inputs, regions)):
        shape = tuple(hi - lo for lo, hi in r)
        nbytes = _nbytes(shape, t.dtype)
        read += nbytes
        if any(s > c for s, c in zip(shape, chunk_of(t.id))):
            pieces += nbytes
        if at == 1:  # the indices
            n_index = math.prod(shape)
    return TaskCost(read + pieces + INDEX_SCRATCH_BYTES * n_index + out_bytes,
                    math.prod(out_chunk) + n_index, read, out_bytes)


def scan_cost(node: Node, x: Node, chunk_of: ChunkOf, out_chunk, out_bytes) -> TaskCost:
    """A scan's task (`kernels/scan.py`): its chunk of x (and the pieces it is assembled
    from, where x is chunked otherwise), the carry (a cross-section of the chunk in the
    accumulator dtype), the accumulator block it scans in unless the result is in the
    accumulator's dtype already, and the result. The total of a chunk, its other task along
    a split axis, holds less: the chunk and a cross-section."""
    axis = node.attr("axis")
    acc = dtypes.accumulator(node.dtype)
    block = _nbytes(out_chunk, x.dtype)
    pieces = block if tuple(chunk_of(x.id)) != tuple(out_chunk) else 0
    carry = _nbytes(out_chunk[:axis] + out_chunk[axis + 1:], acc)
    scratch = 0 if acc == node.dtype else \
        scratch_elements(out_chunk, axis) * dtypes.itemsize(acc)
    n = math.prod(out_chunk)
    return TaskCost(block + pieces + carry + scratch + out_bytes,
                    n * get_op(node.op).flops_per_element, block + carry, out_bytes)


def bfloat16_widening(inputs: list[Node], in_bytes: list[int], out_bytes: int,
                      out_dtype: str) -> int:
    """Bytes a task adds when it computes bfloat16 in float32 (`kernels/tasks.py`: matmul and
    softmax): a float32 copy of each bfloat16 operand, twice its bytes, and its float32
    result before that is rounded to bfloat16."""
    copies = sum(2 * n for t, n in zip(inputs, in_bytes) if t.dtype == "bfloat16")
    return copies + (2 * out_bytes if out_dtype == "bfloat16" else 0)


def reduce_space(inputs: list[Node]) -> tuple[int, ...]:
    """Shape of the tensor a reduction reduces: its prologue's result (the broadcast of its
    inputs), or its single input."""
    return tuple(np.broadcast_shapes(*[t.shape for t in inputs]))


def main_cost(node: Node, inputs: list[Node], chunk_of: ChunkOf, space_chunk=None,
              k_chunk: int | None = None) -> TaskCost:
    """Cost of the node's main task (one per chunk, or per partial for reductions/matmul)."""
    spec = get_op(node.op)
    out_chunk = chunk_of(node.id)
    out_bytes = _nbytes(out_chunk, node.dtype)
    in_bytes = sum(_nbytes(chunk_of(t.id), t.dtype) for t in inputs)
    n_out = math.prod(out_chunk)

    if spec.kind == SOURCE:
        ws = out_bytes + int(n_out * spec.temp_bytes_per_element)
        return TaskCost(ws, n_out * spec.flops_per_element, 0, out_bytes)
    if spec.kind == ELEMENTWISE:
        program = node.attr("program") or ((node.op, (), node.dtype),)
        # Inputs, the result, and room for one cast copy of it.
        return TaskCost(in_bytes + 2 * out_bytes + whole_axis_scratch(program, out_chunk),
                        n_out * program_flops(program), in_bytes, out_bytes)
    if spec.kind == MATMUL:
        a, b = inputs[0], inputs[1]
        m, n = out_chunk[-2], out_chunk[-1]
        k = k_chunk if k_chunk is not None else a.shape[-1]
        batch = math.prod(out_chunk[:-2])
        a_bytes = _nbytes(chunk_of(a.id)[:-2] + (m, k), a.dtype)
        b_bytes = _nbytes(chunk_of(b.id)[:-2] + (k, n), b.dtype)
        extra = sum(_nbytes(chunk_of(t.id), t.dtype) for t in inputs[2:])
        flops = 2.0 * batch * m * n * k
        epilogue = node.attr("epilogue")
        if epilogue:
            flops += n_out * program_flops(epilogue)
        widened = bfloat16_widening([a, b], [a_bytes, b_bytes], out_bytes, node.dtype)
        return TaskCost(a_bytes + b_bytes + 2 * out_bytes + extra + widened, flops,
                        a_bytes + b_bytes, out_bytes)
    if spec.kind == REDUCE:
        space = space_chunk
        n_space = math.prod(space)
        prologue = node.attr("prologue")
        operand = _nbytes(space, prologue[-1][2]) if prologue else 0
        # Sums keep float64 partials (see lower.py): twice a float32 result's bytes.
        acc = dtypes.accumulator(node.dtype) if node.op in ACCUMULATED else node.dtype
        partial = _nbytes(tuple(1 if i in node.attr("axes") else s
                                for i, s in enumerate(space)), acc)
        flops = n_space * (1 + (program_flops(prologue) if prologue else 0))
        scratch = whole_axis_scratch(prologue, space)
        return TaskCost(in_bytes + operand + 2 * partial + scratch, flops, in_bytes, partial)
    if spec.kind == AXIS_WHOLE:
        # When the operand is split along the axis, its rows arrive in pieces that are then
        # assembled: both are held at once.
        t = inputs[0]
        region = n_out * dtypes.itemsize(t.dtype)
        axis = node.attr("axis")
        pieces = region if chunk_of(t.id)[axis] < t.shape[axis] else 0
        ws = region + pieces + out_bytes + int(n_out * spec.temp_bytes_per_element) + \
            bfloat16_widening([t], [region], out_bytes, node.dtype)
        return TaskCost(ws, n_out * spec.flops_per_element, region, out_bytes)
    if spec.kind == GATHER:
        # The block of x with its axis whole (and its pieces, when x is split along it), the
        # indices, and the result.
        x, indices = inputs
        axis = node.attr("axis")
        x_chunk = chunk_of(x.id)
        block = _nbytes(x_chunk[:axis] + (x.shape[axis],) + x_chunk[axis + 1:], x.dtype)
        pieces = block if x_chunk[axis] < x.shape[axis] else 0
        idx = _nbytes(chunk_of(indices.id), indices.dtype)
        return TaskCost(block + pieces + idx + out_bytes, n_out, block + idx, out_bytes)
    if spec.kind == WINDOW:
        if node.dtype != "bfloat16":
            return window_cost(node, inputs, chunk_of, out_chunk, out_bytes)
        # computed on float32 copies (`kernels/tasks.py`), the bfloat16 chunks held besides
        wide = [replace(t, dtype="float32") if t.dtype == "bfloat16" else t for t in inputs]
        cost = window_cost(replace(node, dtype="float32"), wide, chunk_of, out_chunk,
                           2 * out_bytes)
        return TaskCost(cost.working_set + in_bytes + out_bytes, cost.flops,
                        cost.bytes_in // 2, out_bytes)
    if spec.kind == INDEXED:
        return indexed_cost(node, inputs, chunk_of, out_chunk, out_bytes)
    if spec.kind == SCAN:
        return scan_cost(node, inputs[0], chunk_of, out_chunk, out_bytes)
    if spec.kind == LAYOUT:
        if node.op == "slice":
            # A chunk of c elements along an axis of step s reads (c - 1) s + 1 of them: the
            # first and then one every s (a step past the input's end reads one).
            steps = node.attr("steps")
            region = math.prod((c - 1) * s + 1 if c else 0 for c, s in zip(out_chunk, steps))
            read = region * dtypes.itemsize(inputs[0].dtype)
            return TaskCost(read + 2 * out_bytes, 0, read, out_bytes)
        extra = 0
        if node.op == "reshape":
            # A run of whole operand rows reads nothing more; any other run reads the operand
            # rows around it: up to one row more at each end.
            t = inputs[0]
            t_lead = next((a for a, e in enumerate(t.shape) if e > 1), None)
            lead = next((a for a, e in enumerate(node.shape) if e > 1), None)
            if t_lead is not None and lead is not None:
                row_in = math.prod(t.shape[t_lead + 1:])
                run = out_chunk[lead] * math.prod(node.shape[lead + 1:])
                if row_in and run % row_in:
                    extra = 2 * row_in * dtypes.itemsize(t.dtype)
        # Pieces of the operand, the assembled block and the result.
        return TaskCost(3 * out_bytes + 2 * extra, 0, out_bytes + extra, out_bytes)
    raise AssertionError(f"no cost model for kind {spec.kind}")


def combine_cost(partial_bytes: int, fanin: int) -> int:
    """Working set of a tree-reduction step that combines `fanin` partial results."""
    return (fanin + 1) * partial_bytes


def measured_task_seconds(label: str, flops: float, moved: float, cluster) -> float | None:
    """Expected seconds of one task of the operator `label` doing `flops` and moving `moved`
    bytes, averaged over the cluster's workers, by the speeds the registry measured there
    (`registry/speeds.py`); None unless every worker has measured it (the cost model's
    rates alone can be 20-30x off, too far to decide chunk sizes by)."""
    speeds = [w.speeds.get(label) for w in cluster.workers]
    if not speeds or any(speed is None for speed in speeds):
        return None
    return sum(speed.seconds(flops, moved) for speed in speeds) / len(speeds)
