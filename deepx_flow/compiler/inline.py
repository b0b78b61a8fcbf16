"""Pass: compute source reads and views inside the tasks that use them.

Before: a lowered Dask graph, and for some of its keys a kernel call that computes the same
chunk (the lowering's `inlinable`): either a *view* (a transpose, a reshape that keeps the layout, a
slice or concat of whole chunks: no copy, so free to compute in every task that reads it) or
a *source* (a Zarr, `.npy` or stored-asset read, a random or constant chunk: worth computing
where it is used, but only once; a reduction's only partial of a result chunk is one too, so
a small reduction is one task, not a partial and a finish a scheduler round trip apart, as
long as its reader reads no other chunk of it: that reader would otherwise hold every block
the chunks are computed from at once).
After: every task that read a view computes the view itself; a source chunk read by exactly
one reference of one task (after views are inlined) is read inside that task. Those keys
are gone from the graph, unless they are outputs. Results are unchanged; what changes is
that no chunk is copied to make a view, and a source chunk is not held in worker memory as a
task result of its own between its read and its use (dask.array fuses its reads the same
way).

A source chunk with several readers stays a task: reading it once and sharing the result
is cheaper than reading it again per reader. So is one read twice by the same task (`x.T @ x`
reads each chunk of `x` as both operands).

`predicted_inline(graph)` says, before any lowering, which source nodes a node's tasks are
expected to read inline, `finished_by_reader` which reductions finish inside a reader, and
`chained_matmuls` (given the partition) which matmuls the lowering computes inside a later
one's tasks: the plan's estimates (`Plan.stats`) and the labels speeds are measured under
(`ir.program.speed_label`) follow them; the partitioner, which runs before the chains are
known, looks a chain's last matmul up under its own label. Inputs bound at run time are left
out of it (only a file input is read inline; data held in the graph is not).
"""

from __future__ import annotations

import math
from collections import Counter

from deepx_flow.compiler.taskspec import inline_task, inlined_chunks, refs_of, substitute
from deepx_flow.ir import Graph
from deepx_flow.ir.keys import key_name, node_of
from deepx_flow.ops import ELEMENTWISE, MATMUL, REDUCE, SCAN, get_op
from deepx_flow.ops import SOURCE as SOURCE_KIND

VIEW, SOURCE = "view", "source"
MAX_NESTING = 16


def inline_reads(dsk: dict, inlinable: dict, keep) -> dict:
    """The graph with views and single-use source chunks computed where they are read.

    Parameters
    ----------
    dsk : dict
        Key -> task, in an order where every task comes after the keys it reads (the
        lowering's order).
    inlinable : dict
        Key -> (VIEW or SOURCE, func, args): `func(*args)` computes that key's chunk (the
        inline call is built only for the keys inlined).
    keep : set
        Keys that must stay in the graph (the outputs).
    """
    if not inlinable:
        return dsk
    readers: dict = {}  # key -> Counter of the tasks reading it, one count per reference
    for key, node in dsk.items():
        for ref in refs_of(node):
            readers.setdefault(ref, Counter())[key] += 1

    # Views are inlined everywhere, but not nested deeper than MAX_NESTING: Dask runs nested
    # calls recursively, and a chain of thousands of concats is all views.
    depth: dict = {}
    views = set()
    for key, node in dsk.items():
        if inlinable.get(key, (None,))[0] == VIEW:
            depth[key] = 1 + max((depth.get(r, 0) for r in refs_of(node)), default=0)
            if depth[key] <= MAX_NESTING:
                views.add(key)
            else:
                depth[key] = 0
    # References to each key once the views reading it are inlined into their readers (a
    # kept view also reads it in its own task). Readers come after what they read.
    references: dict = {}
    for key in reversed(list(dsk)):
        references[key] = sum(count * (references[reader] + (reader in keep))
                              if reader in views else count
                              for reader, count in readers.get(key, {}).items())

    names_read: dict = {}  # reader -> Counter of the tensor names it reads (made when asked)
    calls: dict = {}  # key -> its inline call, with the calls it reads substituted
    for key in dsk:
        kind, func, args = inlinable.get(key, (None, None, None))
        if key in views or (kind == SOURCE and key not in keep and references[key] == 1
                            and not _gathers_computed_chunks(key, dsk, readers, views,
                                                             names_read)):
            calls[key] = substitute(inline_task(key, func, *args), calls)
    return {key: substitute(node, calls) for key, node in dsk.items()
            if key not in calls or key in keep}


def _gathers_computed_chunks(key, dsk: dict, readers: dict, views: set, names_read: dict
                             ) -> bool:
    """Whether `key` is computed from other chunks (a reduction's finish or partial, unlike a
    file read) and the task that would compute it reads more chunks of the same tensor, or
    of a view of it that is computed in that task: inlining them all would make that task
    wait for, and hold, every chunk they are computed from (a reshape reading 30 chunks of a
    mean over images held the 30 image blocks the means reduce at once)."""
    if not refs_of(dsk[key]):
        return False
    current = key
    while len(readers.get(current, ())) == 1:
        (reader,) = readers[current]
        if reader not in names_read:  # once per reader, not once per chunk it reads
            names_read[reader] = Counter(key_name(r) for r in refs_of(dsk[reader]))
        if names_read[reader][key_name(current)] > 1:
            return True
        if reader not in views:
            return False
        current = reader
    return False


def inlined_nodes(dsk: dict, graph: Graph, chained: dict | None = None
                  ) -> dict[str, frozenset]:
    """Node id -> the ids of the source nodes whose chunks its tasks read inline (views are
    left out: they cost nothing), and of the matmuls `chained` into them
    (`chained_matmuls`). One task of each tensor is looked at: the pass treats a node's
    chunks alike unless grids are uneven, and this serves labels and policies."""
    out, seen = {}, set()
    for key, node in dsk.items():
        name = key_name(key)
        if name in seen:
            continue
        seen.add(name)
        inner = frozenset(i for i in (node_of(key_name(k)) for k in inlined_chunks(node))
                          if i in graph and get_op(graph[i].op).kind == SOURCE_KIND)
        if inner:
            owner = node_of(name)
            out[owner] = out.get(owner, frozenset()) | inner
    for node_id, reader in (chained or {}).items():
        out[reader] = out.get(reader, frozenset()) | {node_id}
    return out


def predicted_inline(graph: Graph, part=None) -> dict[str, frozenset]:
    """Node id -> the source nodes its tasks are expected to read inline: each source that
    is not an output and that exactly one node reads once, directly or through transposes
    only it reads; given the partition, also only where that node has one task per chunk
    of the source (a matmul tiled along N reads each block of A once per tile; a scan split
along its axis reads each chunk for its total and its scan)."""
    users = graph.consumers()
    outputs = {node_id for _, node_id in graph.outputs}
    out: dict = {}
    for node in graph.nodes:
        if get_op(node.op).kind != SOURCE_KIND or node.op == "input" or node.id in outputs:
            continue
        reader = node.id
        while len(users[reader]) == 1 and graph[users[reader][0]].op == "transpose" \
                and users[reader][0] not in outputs:
            reader = users[reader][0]
        if len(users[reader]) != 1:
            continue
        consumer = users[reader][0]
        if part is not None and (main_tasks(graph[consumer], part) != math.prod(
                len(c) for c in part.chunks[node.id]) or _reads_twice(graph[consumer], part)):
            continue
        out[consumer] = out.get(consumer, frozenset()) | {node.id}
    return out


def _reads_twice(node, part) -> bool:
    """Whether `node`'s tasks read each chunk of its operand twice: a scan split along its
    axis reads a chunk for its total and again for its scan (the last chunk of each line,
    whose total nothing needs, once: it alone is read inline)."""
    return get_op(node.op).kind == SCAN and len(part.chunks[node.id][node.attr("axis")]) > 1


def finished_by_reader(node, graph: Graph, part, users, outputs) -> bool:
    """Whether the pass computes a reduction's finish inside the one task reading each of its
    result chunks (`users` is `graph.consumers()`): it is no output, and its one reader reads
    it once, and either is elementwise with as many tasks as it has result chunks (more
    would read a chunk each), or is a reduction whose partials are its result chunks (its
    reduced space has their grid: each partial reads one, the loss of a batch summed
    into its mean, say)."""
    readers = users[node.id]
    if node.id in outputs or len(readers) != 1:
        return False
    reader = graph[readers[0]]
    if list(reader.inputs).count(node.id) != 1:
        return False
    kind = get_op(reader.op).kind
    if kind == REDUCE:
        return _grid(part.spaces[reader.id]) == _grid(part.chunks[node.id])
    return (kind == ELEMENTWISE
            and math.prod(len(c) for c in part.chunks[reader.id]) ==
            math.prod(len(c) for c in part.chunks[node.id]))


def _grid(chunks) -> tuple:
    return tuple(tuple(c) for c in chunks)


def chained_matmuls(graph: Graph, part, exclude=frozenset()) -> dict[str, str]:
    """Matmuls computed inside the matmul that reads them, a block of rows at a time (the
    layers of an MLP: `relu(x @ W1 + b1) @ W2`), as node id -> the id of the matmul whose
    tasks compute it (the last of the chain). The hidden activations are then never stored:
    each block of rows goes through every layer while it is in cache.

    A matmul chains into its reader when it is no output, its one reader is a matmul that
    reads it once as its left operand, both are 2-D with their contractions whole (no K
    partials), and both right operands (the weights) and the reader's columns are one chunk
    each (so no tile recomputes the chain). Nodes in `exclude` (those of batch chains,
    `compiler.batch_chain`, which take matmuls as layers too) are left out."""
    users = graph.consumers()
    outputs = {node_id for _, node_id in graph.outputs}
    chained: dict[str, str] = {}
    for node in reversed(graph.nodes):  # readers first: a chain's end is known
        readers = users[node.id]
        if (get_op(node.op).kind != MATMUL or node.id in outputs or len(readers) != 1
                or node.ndim != 2 or node.id in exclude or readers[0] in exclude):
            continue
        reader = graph[readers[0]]
        if (get_op(reader.op).kind == MATMUL and reader.ndim == 2
                and reader.inputs[0] == node.id and node.id not in reader.inputs[1:]
                and len(part.k_chunks[node.id]) == 1 and len(part.k_chunks[reader.id]) == 1
                and len(part.chunks[reader.id][1]) == 1
                and all(len(c) == 1 for m in (node, reader)
                        for c in part.chunks[m.inputs[1]])):
            chained[node.id] = chained.get(reader.id, reader.id)
    return chained


def main_tasks(node, part) -> int:
    """Tasks of `node` that read its operands: one per chunk, per chunk of the reduced space
    for a reduction, per tile and K chunk for a matmul."""
    kind = get_op(node.op).kind
    if kind == REDUCE:
        return math.prod(len(c) for c in part.spaces[node.id])
    n = math.prod(len(c) for c in part.chunks[node.id])
    return n * len(part.k_chunks[node.id]) if kind == MATMUL else n
