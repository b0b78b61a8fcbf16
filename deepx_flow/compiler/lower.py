"""Pass: lower a partitioned graph to one Dask task graph with deterministic keys.

Before: a `Partition` and the sources bound to the graph's inputs.
After: a `Lowered` holding a Dask graph (`dask._task_spec` tasks) and, for every output, the
keys of its chunks in grid order. Every key is `(tensor key, *chunk index)`: the tensor key is
the node id, with a token of the bound input data for nodes that depend on inputs (and of the
stored array a `read_zarr` node reads, from a listing of its files: `storage/tokens.py`), so
the same computation gets the same keys in every process and different data never shares a
key.
Internal steps of a node (matmul partial products, tree-reduction levels, a scan's chunk
totals and carries) get keys `(tensor key + ".partial" | ".level<L>" | ".total" | ".carry",
...)`.

Sums and means add up in `dtypes.accumulator` of their result dtype (float64 for float16 and
float32): their partials and tree levels hold float64, and only the last step rounds to the
result's dtype, so a float32 sum is the float64 sum rounded once, the same within one
rounding on every chunk grid. Matmul K-partials keep the product's dtype: each is a float32
BLAS product accumulated over its K chunk, whose rounding dwarfs that of adding a few of them,
so float64 there would double the partials' bytes for little.

A task that needs a region of an operand that is not exactly one of its chunks receives the
overlapping chunks and a layout, and assembles the region itself (`kernels.tasks`), so
misaligned grids cost a copy, not an extra task. Only `deepx_flow.compiler.taskspec` touches
Dask's task classes.

The lowering also says which chunks could be computed inside the tasks that read them (source
reads, and layout operators that need no copy: views), and hands them to the
`deepx_flow.compiler.inline` pass, which decides.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize

from deepx_flow.compiler import batch_chain
from deepx_flow.compiler.inline import SOURCE as INLINE_SOURCE
from deepx_flow.compiler.inline import VIEW, inline_reads
from deepx_flow.compiler.partition import Partition
from deepx_flow.compiler.pool_first import commuting_operands
from deepx_flow.compiler.taskspec import ref, task
from deepx_flow.ir import Node, dtypes
from deepx_flow.ir.keys import tensor_key
from deepx_flow.ir.program import node_program
from deepx_flow.kernels import tasks as K
from deepx_flow.ops import (AXIS_WHOLE, ELEMENTWISE, GATHER, INDEXED, MATMUL, REDUCE, SCAN,
                            SOURCE, WINDOW, get_op)
from deepx_flow.ops.reductions import ACCUMULATED, COMBINE
from deepx_flow.ops.window import input_window
from deepx_flow.ops.window_attrs import spatial_attrs

Region = tuple[tuple[int, int], ...]


@dataclass
class Lowered:
    """A Dask graph and where each output's chunks are."""

    dsk: dict
    outputs: dict[str, tuple[str, tuple[tuple[int, ...], ...]]]  # name -> (tensor key, chunks)

    def output_keys(self, name: str) -> list[tuple]:
        key, chunks = self.outputs[name]
        return [(key, *idx) for idx in itertools.product(*(range(len(c)) for c in chunks))]


class Grid:
    """Chunk boundaries of one tensor, for finding the chunks under a region."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.starts = [tuple(itertools.accumulate((0,) + c[:-1])) for c in chunks]
        # (start, stop) of each chunk along each axis -> its index: the common case of a
        # region that is exactly one chunk is a few dictionary lookups.
        self.bounds = [tuple((s, s + c) for s, c in zip(starts, sizes))
                       for starts, sizes in zip(self.starts, chunks)]
        self.exact = [{b: i for i, b in enumerate(bounds)} for bounds in self.bounds]

    def region(self, idx) -> Region:
        return tuple(b[i] for b, i in zip(self.bounds, idx))

    def cover(self, region: Region):
        """Per axis, the chunk indices overlapping the region and the local slice of each."""
        per_axis = []
        for (lo, hi), starts, sizes in zip(region, self.starts, self.chunks):
            first = max(0, bisect.bisect_right(starts, lo) - 1)
            if hi <= lo:
                per_axis.append([(first, (lo - starts[first],) * 2)])
                continue
            last = bisect.bisect_left(starts, hi) - 1
            per_axis.append([(i, (max(lo, starts[i]) - starts[i],
                                  min(hi, starts[i] + sizes[i]) - starts[i]))
                             for i in range(first, last + 1)])
        return per_axis

    def layout(self, name: str, region: Region):
        """(layout, keys) giving a task `region` of the tensor whose keys start with `name`:
        `()` and one key when the region is exactly a chunk, else the piece grid, the slice
        of each piece, and the keys of the pieces in C order."""
        idx = [exact.get(bounds) for bounds, exact in zip(region, self.exact)]
        if None not in idx:
            return (), [(name, *idx)]
        cover = self.cover(region)
        shape = tuple(len(c) for c in cover)
        keys, slices = [], []
        for combo in itertools.product(*cover):
            keys.append((name, *(i for i, _ in combo)))
            slices.append(tuple(s for _, s in combo))
        return (shape, tuple(slices)), keys


def _stored_token(node: Node) -> str | None:
    """The token of the data a `read_zarr` node reads now (None for other nodes): a stored
    asset version is named by its manifest's digest, one of its attributes already; any
    other array by a listing of its files (`storage.tokens.data_token`), so a run after the
    array was written again never takes chunks computed from what it held before."""
    if node.op != "read_zarr" or node.attr("manifest"):
        return None
    from deepx_flow.storage.tokens import data_token
    return data_token(node.attr("uri"))


def chunk_indices(chunks):
    return itertools.product(*(range(len(c)) for c in chunks))


def lower_partition(part: Partition, sources: dict, to_host: bool = False,
                    inline: bool = True) -> Lowered:
    """Build the Dask graph of `part`; see the module docstring.

    Parameters
    ----------
    part : Partition
        The chunked graph.
    sources : dict
        Input name -> an object with `task(key, region)` returning the task that loads that
        region and `token`, which identifies the data (see `deepx_flow.runtime.inputs`);
        with `inline(region)`, its reads may be computed inside their readers, and with
        `dask_tasks()`, the tasks it returns (a dask array's) join the graph.
    to_host : bool
        Add a task per output chunk that moves it to host memory (GPU workers).
    inline : bool
        Run the `inline_reads` pass (off only to compare against it in tests).
    """
    graph = part.graph
    grids = {n.id: Grid(part.chunks[n.id]) for n in graph.nodes}
    tkey: dict[str, str] = {}
    for node in graph.nodes:
        # Keys are content addresses: the operator, its attributes, its chunking and the keys
        # of its operands (for an input, the token of the data bound to it). The same
        # computation gets the same keys in every process; anything else never shares one.
        data = sources[node.id].token if node.op == "input" else _stored_token(node)
        static = part.node_tokens.get(node.id)
        if static is None:  # once per plan: a fused program's attributes are slow to tokenize
            static = part.node_tokens[node.id] = tokenize(
                node.op, node.attrs, node.shape, node.dtype, part.chunks[node.id],
                part.spaces.get(node.id), part.k_chunks.get(node.id), part.fanin.get(node.id))
        content = (static, [tkey[i] for i in node.inputs], data)
        tkey[node.id] = tensor_key(node.id, node.op, tokenize(content)[:12])
    dsk: dict = {}
    inlinable: dict = {}  # key -> (VIEW or INLINE_SOURCE, func, args): func(*args) is it
    # computed inside a later node's tasks
    batch, chained = batch_chain.all_chains(graph, part)
    batch_ends = set(batch.values())

    def operand(t_id: str, region: Region):
        return grids[t_id].layout(tkey[t_id], region)

    def operands(ids, regions):
        layouts, keys = [], []
        for t_id, region in zip(ids, regions):
            layout, ks = operand(t_id, region)
            layouts.append(layout)
            keys += ks
        return tuple(layouts), [ref(k) for k in keys]

    for node in graph.nodes:
        kind = get_op(node.op).kind
        grid = grids[node.id]
        name = tkey[node.id]
        ins = [graph[i] for i in node.inputs]
        if node.id in batch:
            continue
        if node.id in batch_ends:
            _lower_batch_chain(node, part, batch, grid, name, operands, dsk)
        elif node.op == "input":
            source = sources[node.id]
            for idx in chunk_indices(grid.chunks):
                key = (name, *idx)
                dsk[key] = source.task(key, grid.region(idx))
                if hasattr(source, "inline"):  # a file read; data held in the graph is not
                    inlinable[key] = (INLINE_SOURCE, *source.inline(grid.region(idx)))
        elif kind == SOURCE:
            attrs = dict(node.attrs)
            for idx in chunk_indices(grid.chunks):
                key = (name, *idx)
                args = (node.op, attrs, node.shape, grid.region(idx), node.dtype)
                dsk[key] = task(key, K.source_chunk, *args)
                inlinable[key] = (INLINE_SOURCE, K.source_chunk, args)
        elif kind == ELEMENTWISE:
            program = node_program(node)
            for idx in chunk_indices(grid.chunks):
                key = (name, *idx)
                region = grid.region(idx)
                layouts, refs = operands(node.inputs, [_broadcast_region(t, region)
                                                       for t in ins])
                shape = tuple(b - a for a, b in region)
                dsk[key] = task(key, K.fused_chunk, program, shape, layouts, *refs)
        elif kind == MATMUL and node.id in chained:
            continue
        elif kind == MATMUL and node.inputs[0] in chained:
            _lower_matmul_chain(node, graph, chained, grid, name, operands, dsk)
        elif kind == MATMUL:
            _lower_matmul(node, ins, part, grid, name, operands, dsk)
        elif kind == REDUCE:
            _lower_reduce(node, ins, part, grid, name, operands, dsk, inlinable)
        elif kind == INDEXED:
            _lower_indexed(node, ins, grid, name, operands, dsk)
        elif kind == SCAN:
            _lower_scan(node, grid, name, operands, dsk)
        elif kind == GATHER:
            x, indices = ins
            axis = node.attr("axis")
            for idx in chunk_indices(grid.chunks):
                key = (name, *idx)
                region = grid.region(idx)
                x_region = region[:axis] + ((0, x.shape[axis]),) + \
                    region[axis + indices.ndim:]
                layouts, refs = operands(node.inputs,
                                         [x_region, region[axis:axis + indices.ndim]])
                dsk[key] = task(key, K.take_chunk, axis, layouts, *refs)
        elif kind == WINDOW:
            for idx in chunk_indices(grid.chunks):
                key = (name, *idx)
                x_region, attrs = _window_region(node, ins, grid.region(idx))
                regions = [x_region] + [tuple((0, s) for s in t.shape) for t in ins[1:]]
                layouts, refs = operands(node.inputs, regions)
                dsk[key] = task(key, K.window_chunk, node.op, attrs, layouts, *refs)
        elif kind == AXIS_WHOLE:
            for idx in chunk_indices(grid.chunks):
                key = (name, *idx)
                layouts, refs = operands(node.inputs, [grid.region(idx)])
                dsk[key] = task(key, K.softmax_chunk, node.op, node.attr("axis"), layouts, *refs)
        else:
            _lower_layout(node, ins, grid, name, operands, dsk, inlinable)

    keep = {(tkey[node_id], *idx) for _, node_id in graph.outputs
            for idx in chunk_indices(part.chunks[node_id])}
    dsk = inline_reads(dsk, inlinable if inline else {}, keep)
    for source in {id(s): s for s in sources.values() if hasattr(s, "dask_tasks")}.values():
        # a dask array's own tasks (`runtime.inputs.DaskSource`), added after the inline
        # pass (which has nothing to inline among them), ahead of the tasks that read them
        dsk = {**source.dask_tasks(), **dsk}
    outputs = {}
    for out_name, node_id in graph.outputs:
        key, chunks = tkey[node_id], part.chunks[node_id]
        if to_host:
            host = key + ".host"
            for idx in chunk_indices(chunks):
                dsk[(host, *idx)] = task((host, *idx), K.to_host, ref((key, *idx)))
            key = host
        outputs[out_name] = (key, chunks)
    return Lowered(dsk, outputs)


def _broadcast_region(t: Node, region: Region) -> Region:
    """The region of operand `t` that broadcasts onto `region` of the result."""
    offset = len(region) - t.ndim
    return tuple((0, 1) if t.shape[j] == 1 else region[j + offset] for j in range(t.ndim))


def _tree(keys: list, fanin: int, base: str, idx: tuple, dsk: dict, combine, *args) -> list:
    """Combine `keys` in groups of `fanin` until at most `fanin` remain; return those."""
    level = 0
    while len(keys) > fanin:
        level += 1
        grouped = []
        for g in range(0, len(keys), fanin):
            key = (f"{base}.level{level}", *idx, g // fanin)
            dsk[key] = task(key, combine, *args, *[ref(k) for k in keys[g:g + fanin]])
            grouped.append(key)
        keys = grouped
    return keys


def _lower_matmul(node, ins, part, grid, name, operands, dsk):
    a, b, extras = ins[0], ins[1], ins[2:]
    k_starts = list(itertools.accumulate((0,) + part.k_chunks[node.id][:-1]))
    k_regions = [(s, s + c) for s, c in zip(k_starts, part.k_chunks[node.id])]
    epilogue = node.attr("epilogue")
    fanin = part.fanin[node.id]
    nb = node.ndim - 2
    for idx in chunk_indices(grid.chunks):
        key = (name, *idx)
        region = grid.region(idx)
        batch, (m0, m1), (n0, n1) = region[:nb], region[-2], region[-1]
        shape = tuple(hi - lo for lo, hi in region)
        extra_layouts, extra_refs = operands([t.id for t in extras],
                                             [_broadcast_region(t, region) for t in extras])
        partials = []
        for kk, (k0, k1) in enumerate(k_regions):
            a_reg = _broadcast_region(a, batch + ((m0, m1), (k0, k1)))
            b_reg = _broadcast_region(b, batch + ((k0, k1), (n0, n1)))
            a_reg = a_reg[:-2] + ((m0, m1), (k0, k1))
            b_reg = b_reg[:-2] + ((k0, k1), (n0, n1))
            layouts, refs = operands([a.id, b.id], [a_reg, b_reg])
            if len(k_regions) == 1:
                dsk[key] = task(key, K.matmul_chunk, epilogue, shape, node.dtype,
                                layouts + extra_layouts, *refs, *extra_refs)
                break
            pkey = (f"{name}.partial", *idx, kk)
            dsk[pkey] = task(pkey, K.matmul_chunk, None, shape, None, layouts, *refs)
            partials.append(pkey)
        if partials:
            # finish_matmul is told the product's dtype (a bfloat16 product's partial
            # products are float32, rounded once there, before any epilogue)
            product = dtypes.ufunc_result(np.matmul, a.dtype, b.dtype)
            last = _tree(partials, fanin, name, idx, dsk, K.combine_partials, "sum")
            dsk[key] = task(key, K.finish_matmul, epilogue, shape, product, len(last),
                            extra_layouts, *[ref(k) for k in last], *extra_refs)


def _lower_indexed(node, ins, grid, name, operands, dsk):
    """One task per result chunk of a scatter or an element gather, reading the operand
    regions its `Tiling` gives (`ops.scatter`)."""
    tiling = get_op(node.op).tiling
    attrs = dict(node.attrs)
    for idx in chunk_indices(grid.chunks):
        key = (name, *idx)
        layouts, refs = operands(node.inputs, tiling.regions(node, ins, grid.region(idx)))
        dsk[key] = task(key, K.indexed_chunk, node.op, attrs, layouts, *refs)


def _lower_scan(node, grid, name, operands, dsk):
    """A scan's tasks, line by line of chunks along its axis, in scan order (from the end for
    `reverse`): each chunk's task scans it with its carry added in (`kernels.scan`); each
    chunk but the last has a total task (its sum along the axis, in the accumulator dtype);
    the carry of the second chunk is the first one's total, and each later carry is one
    task adding the chunk before's total to that chunk's carry. The totals run in parallel;
    only the carries, a cross-section each, are a chain."""
    axis = node.attr("axis")
    exclusive, reverse = node.attr("exclusive"), node.attr("reverse")
    acc = dtypes.accumulator(node.dtype)
    n = len(grid.chunks[axis])
    order = range(n - 1, -1, -1) if reverse else range(n)
    lines = [range(len(c)) if a != axis else (0,) for a, c in enumerate(grid.chunks)]
    for line in itertools.product(*lines):
        carry = None  # the key holding the sum of the chunks before, in scan order
        for step, i in enumerate(order):
            idx = line[:axis] + (i,) + line[axis + 1:]
            key = (name, *idx)
            layouts, refs = operands(node.inputs, [grid.region(idx)])
            dsk[key] = task(key, K.scan_chunk, axis, exclusive, reverse, node.dtype, layouts,
                            *refs, *([ref(carry)] if carry is not None else []))
            if step == n - 1:
                break
            total = (f"{name}.total", *idx)
            dsk[total] = task(total, K.scan_total, axis, acc, layouts, *refs)
            if carry is None:
                carry = total
            else:
                after = (f"{name}.carry", *idx)  # the sum up to and including this chunk
                dsk[after] = task(after, K.combine_partials, "sum", ref(carry), ref(total))
                carry = after


def _lower_matmul_chain(node, graph, chained, grid, name, operands, dsk):
    """One task per row chunk of the last matmul of a chain (`inline.chained_matmuls`): it
    reads the first one's rows, every weight and epilogue operand, and runs the rows through
    every layer (`kernels.tasks.matmul_chain`)."""
    stages = [node]
    while stages[0].inputs[0] in chained:
        stages.insert(0, graph[stages[0].inputs[0]])
    first = stages[0]
    a = graph[first.inputs[0]]
    for idx in chunk_indices(grid.chunks):
        key = (name, *idx)
        (m0, m1), _ = grid.region(idx)
        ids, regions = [a.id], [((m0, m1), (0, a.shape[1]))]
        for stage in stages:
            b = graph[stage.inputs[1]]
            ids.append(b.id)
            regions.append(((0, b.shape[0]), (0, b.shape[1])))
            out_region = ((m0, m1), (0, stage.shape[1]))
            for t in (graph[i] for i in stage.inputs[2:]):
                ids.append(t.id)
                regions.append(_broadcast_region(t, out_region))
        layouts, refs = operands(ids, regions)
        meta = tuple((s.attr("epilogue"), s.dtype, len(s.inputs) - 2) for s in stages)
        dsk[key] = task(key, K.matmul_chain, meta, (m1 - m0, node.shape[1]), layouts, *refs)


def _window_region(node, ins, region) -> tuple[Region, dict]:
    """The region of the input a task of a window node's output `region` reads (its
    images, every channel, and the positions its windows cover), and the node's attributes
    with the padding that task adds (`ops.window.input_window`)."""
    x = ins[0]
    spatial = node.ndim - 2
    kernel = node.attr("kernel") or ins[1].shape[2:]  # a pool's, or a conv's weights'
    strides, pads, dilations = spatial_attrs(node, spatial)
    begins, ends, x_region = [], [], [region[0], (0, x.shape[1])]
    for a in range(spatial):
        (lo, hi), (before, after) = input_window(region[2 + a], x.shape[2 + a], kernel[a],
                                                 strides[a], pads[a], dilations[a])
        x_region.append((lo, hi))
        begins.append(before)
        ends.append(after)
    attrs = dict(node.attrs)
    if any(pads) or any(begins) or any(ends):
        attrs["pads"] = tuple(begins + ends)
    return tuple(x_region), attrs


def _lower_batch_chain(node, part, chained, grid, name, operands, dsk):
    """One task per chunk of images of the last node of a batch chain
    (`compiler.batch_chain`): it reads its chunks of the chain's image operands from outside
    it and every other operand whole, and runs blocks of images through every node
    (`kernels.batch_chain`). Each stage says where each of its operands comes from: an
    image operand of the task ("image", i), an earlier stage ("stage", j) or a whole operand
    ("whole", k)."""
    graph = part.graph
    stages = batch_chain.stages(node, graph, chained)
    images = batch_chain.chain_inputs(stages, graph)
    at_stage = {s.id: j for j, s in enumerate(stages)}
    readers = {s.id: 0 for s in stages}
    for stage in stages:
        for src in stage.inputs:
            if src in readers:
                readers[src] += 1
    descriptions, wholes = [], []
    for stage, after in zip(stages, stages[1:] + [None]):
        picks = batch_chain.image_operands(stage, graph)
        sources = []
        for k, src in enumerate(stage.inputs):
            if k not in picks:
                wholes.append(src)
                sources.append(("whole", len(wholes) - 1))
            elif src in at_stage:
                sources.append(("stage", at_stage[src]))
            else:
                sources.append(("image", images.index(src)))
        description = _chain_stage(stage, graph)
        if description[0] == "fused":
            # whether a max_pool that alone reads it may run first, and which of its
            # operands must then be finite
            finite = commuting_operands(stage, picks[0], graph) \
                if after is not None and after.op == "max_pool" and len(picks) == 1 \
                and readers[stage.id] == 1 and after.inputs[0] == stage.id else None
            description += (finite,)
        descriptions.append((description, tuple(sources)))
    block = batch_chain.images_per_block(stages, graph, part)
    whole = [tuple((0, d) for d in graph[i].shape) for i in wholes]
    for idx in chunk_indices(grid.chunks):
        key = (name, *idx)
        batch = grid.region(idx)[0]
        regions = [(batch,) + tuple((0, d) for d in graph[i].shape[1:]) for i in images]
        layouts, refs = operands(images + wholes, regions + whole)
        dsk[key] = task(key, K.batch_chain_chunk, tuple(descriptions), block, len(images),
                        layouts, *refs)


def _chain_stage(node, graph) -> tuple:
    """What `kernels.batch_chain` runs for `node`."""
    kind = get_op(node.op).kind
    if kind == WINDOW:
        return ("window", node.op, dict(node.attrs))
    if kind == ELEMENTWISE:
        return ("fused", node_program(node))
    if kind == AXIS_WHOLE:
        return ("softmax", node.op, node.attr("axis"))
    if kind == MATMUL:
        return ("matmul", node.attr("epilogue"), node.dtype)
    if kind == REDUCE:
        space = batch_chain.reduced_space(node, graph)
        axes = node.attr("axes")
        acc = dtypes.accumulator(node.dtype) if node.op in ACCUMULATED else None
        return ("reduce", node.op, node.attr("prologue"), axes, acc,
                math.prod(space[a] for a in axes), node.dtype)
    return ("reshape", node.shape[1:])


def _lower_reduce(node, ins, part, grid, name, operands, dsk, inlinable):
    """Reduction tasks: a partial per chunk of the reduced space, a tree of combines, and a
    finish per result chunk. A result chunk made of one partial has it computed inside its
    finish (inlinable, like a source read once), and a finish that one task reads once is
    computed inside that task: a small reduction costs no scheduler round trip of its own."""
    space = Grid(part.spaces[node.id])
    axes = node.attr("axes")
    keepdims = node.attr("keepdims", False)
    prologue = node.attr("prologue")
    fanin = part.fanin[node.id]
    op = node.op
    acc = dtypes.accumulator(node.dtype) if op in ACCUMULATED else None
    count = math.prod(sum(space.chunks[a]) for a in axes)  # elements reduced per result
    groups: dict[tuple, list] = {}
    args: dict = {}  # partial key -> its kernel's arguments
    for sidx in chunk_indices(space.chunks):
        region = space.region(sidx)
        kept = tuple(i for a, i in enumerate(sidx) if a not in axes)
        pkey = (f"{name}.partial", *sidx)
        layouts, refs = operands(node.inputs, [_broadcast_region(t, region) for t in ins])
        shape = tuple(hi - lo for lo, hi in region)
        args[pkey] = (op, prologue, axes, acc, shape, layouts, *refs)
        dsk[pkey] = task(pkey, K.reduce_partial, *args[pkey])
        groups.setdefault(kept, []).append(pkey)
    combine_op = COMBINE[op]
    for kept, keys in groups.items():
        out_idx = []
        it = iter(kept)
        for a in range(len(space.chunks)):
            if a in axes:
                if keepdims:
                    out_idx.append(0)
            else:
                out_idx.append(next(it))
        key = (name, *out_idx)
        if len(keys) == 1:
            inlinable[keys[0]] = (INLINE_SOURCE, K.reduce_partial, args[keys[0]])
        last = _tree(keys, fanin, name, kept, dsk, K.combine_partials, combine_op)
        finish = (op, axes, keepdims, count, node.dtype, *[ref(k) for k in last])
        dsk[key] = task(key, K.finish_reduce, *finish)
        # A result chunk one task reads once is finished inside it (a small combine).
        inlinable[key] = (INLINE_SOURCE, K.finish_reduce, finish)


def _lower_layout(node, ins, grid, name, operands, dsk, inlinable):
    """Layout tasks. One that reads one operand chunk (or part of one) and needs no copy (a
    transpose, a reshape of a whole chunk, a slice with step 1, a flip, a concat of its own
    dtype) is also a view that its readers may compute themselves."""
    (t, *_) = ins
    if node.op == "concat":  # where each operand starts along the axis, found by bisection
        axis = node.attr("axis")
        starts = list(itertools.accumulate((s.shape[axis] for s in ins), initial=0))
    for idx in chunk_indices(grid.chunks):
        key = (name, *idx)
        region = grid.region(idx)
        shape = tuple(hi - lo for lo, hi in region)
        if node.op == "transpose":
            axes = node.attr("axes")
            src = tuple(region[axes.index(j)] for j in range(t.ndim))
            layouts, refs = operands([t.id], [src])
            dsk[key] = task(key, K.transpose_chunk, axes, layouts, *refs)
            if layouts == ((),):  # always: a transpose's grid is its operand's
                inlinable[key] = (VIEW, K.transpose_view, (axes, *refs))
        elif node.op == "reshape":
            source, offset = _reshape_source(t, node, region)
            layouts, refs = operands([t.id], [source])
            dsk[key] = task(key, K.reshape_chunk, shape, offset, layouts, *refs)
            if layouts == ((),) and offset == 0 and \
                    math.prod(hi - lo for lo, hi in source) == math.prod(shape):
                inlinable[key] = (VIEW, K.reshape_chunk, (shape, 0, layouts, *refs))
        elif node.op == "slice":
            starts, steps = node.attr("starts"), node.attr("steps")
            src = tuple((st + lo * sp, st + (hi - 1) * sp + 1) if hi > lo else (st, st)
                        for (lo, hi), st, sp in zip(region, starts, steps))
            layouts, refs = operands([t.id], [src])
            dsk[key] = task(key, K.slice_chunk, steps, layouts, *refs)
            if _one_piece(layouts) and all(s == 1 for s in steps):
                inlinable[key] = (VIEW, K.slice_chunk, (steps, layouts, *refs))
        elif node.op == "flip":  # the mirrored region, reversed
            axes = node.attr("axes")
            src = tuple((n - hi, n - lo) if a in axes else (lo, hi)
                        for a, ((lo, hi), n) in enumerate(zip(region, t.shape)))
            layouts, refs = operands([t.id], [src])
            dsk[key] = task(key, K.flip_chunk, axes, layouts, *refs)
            if _one_piece(layouts):
                inlinable[key] = (VIEW, K.flip_view, (axes, layouts, *refs))
        elif node.op == "concat":
            sources, regions = _concat_sources(ins, starts, axis, region)
            layouts, refs = operands([t.id for t in sources], regions)
            if len(sources) > 1:  # a chunk joining pieces of several operands (`join_pieces`)
                dsk[key] = task(key, K.concat_chunk, node.dtype, axis, layouts, *refs)
                continue
            dsk[key] = task(key, K.cast_chunk, node.dtype, layouts, *refs)
            if _one_piece(layouts) and sources[0].dtype == node.dtype:
                inlinable[key] = (VIEW, K.cast_chunk, (node.dtype, layouts, *refs))
        else:
            raise AssertionError(f"no lowering for {node.op}")


def _concat_sources(ins, starts, axis: int, region) -> tuple[list[Node], list]:
    """The operands a concat's chunk `region` reads and the region of each: from the one
    holding its first row (the last starting at or before it, found by bisection: an empty
    operand starts where the next one does) to the one holding its last. An empty chunk
    (an empty axis) reads that first operand's empty region."""
    lo, hi = region[axis]
    first = bisect.bisect_right(starts, lo, hi=len(ins)) - 1
    sources, regions = [], []
    for j in range(first, len(ins)):
        start, stop = starts[j], starts[j + 1]
        if start >= hi and sources:
            break
        if stop > start or not sources:
            piece = (max(lo, start) - start, min(hi, stop) - start)
            sources.append(ins[j])
            regions.append(tuple(region[:axis]) + (piece,) + tuple(region[axis + 1:]))
    return sources, regions


def _one_piece(layouts) -> bool:
    """Whether the operand is one chunk or a slice of one (a view of it, not a copy)."""
    return all(not layout or all(n == 1 for n in layout[0]) for layout in layouts)


def _reshape_source(t: Node, node: Node, region) -> tuple:
    """The operand rows holding a reshape's output chunk, and where the chunk starts in them.

    The partitioner splits a reshape only along its first axis longer than 1, so an output
    chunk is a contiguous run of elements in row-major order. The operand rows (along the
    operand's first axis longer than 1) that contain that run form a block; the task flattens
    the block and takes the run from `offset`.
    """
    whole = tuple((0, e) for e in t.shape)
    lead = next((a for a, e in enumerate(node.shape) if e > 1), None)
    t_lead = next((a for a, e in enumerate(t.shape) if e > 1), None)
    if lead is None or t_lead is None or t.size == 0:
        return whole, 0
    row_out = math.prod(node.shape[lead + 1:])
    start, stop = region[lead][0] * row_out, region[lead][1] * row_out
    row_in = math.prod(t.shape[t_lead + 1:])
    first, last = start // row_in, -(-stop // row_in)
    source = tuple((first, last) if a == t_lead else w for a, w in enumerate(whole))
    return source, start - first * row_in
