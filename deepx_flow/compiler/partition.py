"""Pass: choose every tensor's chunk grid from the cluster's per-task memory budget.

Before: a fused, typed graph and a `ClusterSpec`.
After: a `Partition` giving each node its chunks (Dask style: per axis, the sizes along it),
the chunking of each reduction's operand space and of each matmul's K axis, and the budget
used. Every task's working set (`deepx_flow.compiler.costs`) fits the budget, and the plan
has at most `max_tasks` tasks (DEEPX_MAX_TASKS); otherwise PlanError names the node that
cannot fit, or the one with the most tasks.

How it chooses:
1. Axes that must be chunked alike are joined into classes (union-find): the operands of an
   elementwise node and its result, matmul's M with its left operand and K on both operands,
   the kept axes of a reduction, a transpose's permuted axes, every axis of a scan with its
   operand's. So aligned operands need no copying. Reshape, slice and the concat axis read
   whatever grid their operand has (the lowering assembles the region a task needs); so
   does softmax's axis when joining it with the operand's would not fit. A concat's chunks
   along its axis are its operands' chunks, runs of small ones joined (`join_pieces`, up to
   `min_chunk_bytes`).
2. Every class starts whole (one chunk per axis: chunks as large as possible). While some
   node's task does not fit, the largest splittable class it touches is halved (a window's
   spatial axes and a scanned axis only when nothing else is left). An axis that must stay
   whole (softmax's axis, a reshape's trailing axes) is never split; when nothing is left
   to split the graph cannot fit.
3. Memory fitting alone can leave a big tensor in one chunk and the cluster idle, so classes
   of large tensors are halved further until each large node has `chunks_per_thread` tasks
   per worker thread (a matmul half as many: each extra tile reads a block of the other
   operand again), never below `min_chunk_bytes`, and, where the registry has measured
   the operator's speed on every worker, never below tasks of `min_task_seconds`. Axes
   that are summed over (matmul's K, reduced axes, a scan's axis) are split for this only
   as a last resort, and (where speeds are measured) only while moving the extra partial
   result over the cluster's measured link takes under a tenth of a task's time. Sources
   follow the grids of users that share their axes.
4. A stored array (`read_zarr` with `storage_chunks`) prefers chunk sizes that are multiples
   of its stored chunks, and for parallelism is split along its stored chunks first (even
   an axis that is summed over, though not a scanned one), never below a stored chunk
   (each piece would decode the whole stored chunk again), and last along an axis a stored
   chunk spans. Sizes rounded to stored chunks make uneven task counts, so the class last
   halved for parallelism then grows back, a stored chunk at a time, to the size whose
   tasks end soonest on the cluster's threads (`_balance`).
5. The plan's tasks (`task_count`, the figure `Plan.stats` reports) are counted from the
   chunk sizes before any list of chunks is built, so a grid of billions of chunks is refused
   at once instead of filling the driver's memory.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from deepx_flow.compiler.costs import (combine_cost, main_cost, measured_task_seconds,
                                       reduce_space)
from deepx_flow.compiler.inline import predicted_inline
from deepx_flow.config import Settings, settings
from deepx_flow.errors import PlanError
from deepx_flow.ir import Graph, Node, dtypes
from deepx_flow.ir.program import speed_label, whole_axes
from deepx_flow.ops import (AXIS_WHOLE, ELEMENTWISE, GATHER, INDEXED, LAYOUT, MATMUL, REDUCE,
                            SCAN, SOURCE, WINDOW, get_op)
from deepx_flow.registry.cluster import ClusterSpec, format_bytes

Chunks = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Partition:
    """The chunking of every tensor of a graph."""

    graph: Graph
    chunks: dict[str, Chunks]              # node id -> chunks of its result
    spaces: dict[str, Chunks]              # reduction id -> chunks of the reduced operand
    k_chunks: dict[str, tuple[int, ...]]   # matmul id -> chunks of K
    budget: int
    fanin: dict[str, int] = field(default_factory=dict)  # tree-reduction fan-in per node
    # Filled by lowering: node id -> the token of its operator, attributes and chunking, the
    # part of its keys that is the same every time this plan is lowered.
    node_tokens: dict[str, str] = field(default_factory=dict, init=False, compare=False,
                                        repr=False)


def regular_chunks(extent: int, size: int) -> tuple[int, ...]:
    """`extent` split into chunks of `size` with a smaller last chunk (at least one chunk)."""
    if extent == 0:
        return (0,)
    size = max(1, min(size, extent))
    full, rest = divmod(extent, size)
    return (size,) * full + ((rest,) if rest else ())


class _Classes:
    """Union-find over axes, each class with an extent, a chunk size, and whether it must
    stay whole."""

    def __init__(self):
        self.parent: dict = {}
        self.extent: dict = {}
        self.size: dict = {}
        self.whole: dict = {}   # class root -> the node that keeps it whole
        self.step: dict = {}    # class root -> preferred multiple for its chunk size
        self.halvings = 0       # chunk sizes change only when this does

    def add(self, key, extent: int):
        if key not in self.parent:
            self.parent[key] = key
            self.extent[key] = extent
            self.size[key] = extent

    def find(self, key):
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:  # path compression
            self.parent[key], key = root, self.parent[key]
        return root

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        assert self.extent[ra] == self.extent[rb], (a, b)
        self.parent[rb] = ra
        if rb in self.whole:
            self.whole.setdefault(ra, self.whole[rb])
        if rb in self.step:
            self.step[ra] = math.lcm(self.step.get(ra, 1), self.step[rb])

    def keep_whole(self, key, reason: str):
        self.whole.setdefault(self.find(key), reason)

    def whole_reason(self, key) -> str | None:
        return self.whole.get(self.find(key))

    def chunk(self, key) -> int:
        root = self.find(key)
        return min(self.size[root], self.extent[root])

    def splittable(self, key) -> bool:
        root = self.find(key)
        return root not in self.whole and self.size[root] > 1 and self.extent[root] > 1

    def prefer(self, key, step: int):
        root = self.find(key)
        self.step[root] = math.lcm(self.step.get(root, 1), step)

    def halve(self, key):
        """Halve the class's chunk size, rounded up to its preferred step while that still
        makes it smaller."""
        root = self.find(key)
        size = self.size[root]
        half = -(-size // 2)
        step = self.step.get(root, 1)
        rounded = -(-half // step) * step
        self.size[root] = rounded if rounded < size else half
        self.halvings += 1


def _align(classes: _Classes, t: Node, t_key: str, out_shape, out_key: str):
    """Join each axis of operand `t` with the result axis it broadcasts against."""
    offset = len(out_shape) - t.ndim
    for j, extent in enumerate(t.shape):
        i = j + offset
        if extent == out_shape[i] and extent != 1:
            classes.union((t_key, j), (out_key, i))


def _join_indexed(classes: _Classes, node: Node, ins: list[Node]) -> None:
    """A scatter's or an element gather's axes, as its `Tiling` (`ops.scatter`) says: operand
    axes chunked like result axes where their extents agree (a shorter operand is assembled
    by the lowering), and the result axes its tasks hold whole."""
    tiling = get_op(node.op).tiling
    for at, axis, out_axis in tiling.aligned(node, ins):
        if ins[at].shape[axis] == node.shape[out_axis]:
            classes.union((ins[at].id, axis), (node.id, out_axis))
    for axis in tiling.whole(node, ins):
        classes.keep_whole((node.id, axis), f"'{node.id}' ({node.op})")


def _reshape_lead(shape) -> int | None:
    for axis, extent in enumerate(shape):
        if extent > 1:
            return axis
    return None


def partition_graph(graph: Graph, cluster: ClusterSpec, config: Settings | None = None
                    ) -> Partition:
    """Pick chunk grids for every tensor of `graph`; see the module docstring.

    A whole axis (softmax's) is first joined with its operand's axis, so no task has to
    assemble rows. When that cannot fit, for example because two softmaxes read one tensor
    along different axes, the plan is made again with those axes left free.
    """
    config = config or settings()
    try:
        return _partition(graph, cluster, config, join_whole_axes=True)
    except PlanError as err:
        # Freeing whole axes helps tasks fit; it never makes fewer of them.
        if isinstance(err, _TooManyTasks) or not any(get_op(n.op).kind == AXIS_WHOLE
                                                     for n in graph.nodes):
            raise
    return _partition(graph, cluster, config, join_whole_axes=False)


class _TooManyTasks(PlanError):
    """The plan is over the task limit (a PlanError to every caller)."""


def _partition(graph: Graph, cluster: ClusterSpec, config: Settings, join_whole_axes: bool
               ) -> Partition:
    budget = cluster.task_budget(config)
    classes = _Classes()
    nodes = graph.nodes
    # The shape each reduction reduces (its prologue's result, or its input).
    space_shapes = {n.id: reduce_space([graph[i] for i in n.inputs]) for n in nodes
                    if get_op(n.op).kind == REDUCE}
    for node in nodes:
        for axis, extent in enumerate(node.shape):
            classes.add((node.id, axis), extent)

    for node in nodes:
        kind = get_op(node.op).kind
        ins = [graph[i] for i in node.inputs]
        if kind == ELEMENTWISE:
            for t in ins:
                _align(classes, t, t.id, node.shape, node.id)
            for axis in whole_axes(node.attr("program")):  # a fused softmax's axis
                classes.keep_whole((node.id, axis), f"'{node.id}' (fused softmax)")
        elif kind == MATMUL:
            a, b = ins[0], ins[1]
            space = node.id + "#k"
            classes.add((space, 0), a.shape[-1])
            classes.union((a.id, a.ndim - 1), (space, 0))
            classes.union((b.id, b.ndim - 2), (space, 0))
            classes.union((a.id, a.ndim - 2), (node.id, node.ndim - 2))
            classes.union((b.id, b.ndim - 1), (node.id, node.ndim - 1))
            batch = node.shape[:-2]
            for t in (a, b):
                off = len(batch) - (t.ndim - 2)
                for j in range(t.ndim - 2):
                    if t.shape[j] == batch[j + off] and t.shape[j] != 1:
                        classes.union((t.id, j), (node.id, j + off))
            for t in ins[2:]:
                _align(classes, t, t.id, node.shape, node.id)
        elif kind == REDUCE:
            space = node.id + "#in"
            shape = space_shapes[node.id]
            for axis, extent in enumerate(shape):
                classes.add((space, axis), extent)
            for t in ins:
                _align(classes, t, t.id, shape, space)
            for axis in whole_axes(node.attr("prologue")):
                classes.keep_whole((space, axis), f"'{node.id}' (softmax in its prologue)")
            axes = node.attr("axes")
            keep = node.attr("keepdims", False)
            out_axis = 0
            for axis in range(len(shape)):
                if axis in axes:
                    out_axis += 1 if keep else 0
                    continue
                classes.union((space, axis), (node.id, out_axis))
                out_axis += 1
        elif kind == AXIS_WHOLE:
            # Unless it is joined, the whole axis leaves the operand free to be split along it
            # for other users, and each task assembles the rows it needs.
            (t,) = ins
            whole = node.attr("axis")
            for axis in range(node.ndim):
                if axis != whole or join_whole_axes:
                    classes.union((t.id, axis), (node.id, axis))
            classes.keep_whole((node.id, whole), f"'{node.id}' ({node.op})")
        elif kind == INDEXED:
            _join_indexed(classes, node, ins)
        elif kind == SCAN:
            # Chunked like its operand on every axis; along the scanned one each chunk takes
            # the carry of those before it (`lower`).
            (t,) = ins
            for axis in range(node.ndim):
                classes.union((t.id, axis), (node.id, axis))
        elif kind == GATHER:
            # The result's axes are x's before `axis`, the indices', then x's after it; x's
            # own `axis` is read whole by each task (assembled if x is split along it).
            x, indices = ins
            axis = node.attr("axis")
            for a in range(axis):
                classes.union((x.id, a), (node.id, a))
            for j in range(indices.ndim):
                classes.union((indices.id, j), (node.id, axis + j))
            for a in range(axis + 1, x.ndim):
                classes.union((x.id, a), (node.id, a - 1 + indices.ndim))
        elif kind == WINDOW:
            # Chunked by batch and spatial axes: a task reads its images' channels whole, the
            # input positions its windows cover (a halo into the neighbouring chunks, which
            # the lowering assembles), and the whole weights.
            classes.union((ins[0].id, 0), (node.id, 0))
            classes.keep_whole((node.id, 1), f"'{node.id}' ({node.op}: its channels)")
        elif node.op == "transpose":
            (t,) = ins
            for i, j in enumerate(node.attr("axes")):
                classes.union((t.id, j), (node.id, i))
        elif node.op == "reshape":
            # A chunk of whole rows along the first axis longer than 1 is a contiguous run of
            # elements: its task reads the operand rows around that run (see the lowering).
            # Runs of whole operand rows need nothing extra, so chunk sizes in multiples of
            # that many result rows are preferred while they fit.
            (t,) = ins
            lead = _reshape_lead(node.shape)
            for axis in range(node.ndim):
                if axis != lead:
                    classes.keep_whole((node.id, axis), f"'{node.id}' (reshape)")
            t_lead = _reshape_lead(t.shape)
            if t.ndim and node.ndim and t.shape[0] == node.shape[0] > 1:
                # the same rows in other shapes (a flatten of images): chunked alike, so
                # a task reads exactly its rows, and a chain of layers (`batch_chain`)
                # runs through the reshape
                classes.union((t.id, 0), (node.id, 0))
            elif lead is not None and t_lead is not None and node.size:
                row_out = math.prod(node.shape[lead + 1:])
                row_in = math.prod(t.shape[t_lead + 1:])
                classes.prefer((node.id, lead), math.lcm(row_out, row_in) // row_out)
        elif node.op == "concat":
            axis = node.attr("axis")
            for t in ins:
                for j in range(t.ndim):
                    if j != axis:
                        classes.union((t.id, j), (node.id, j))
    # Stored arrays read fastest in their own chunks: chunk sizes along their chunked axes
    # are kept to multiples of the stored chunk while that fits.
    stored = {n.id: tuple(n.attr("storage_chunks")) for n in nodes
              if n.op == "read_zarr" and n.attr("storage_chunks")}
    for node_id, store in stored.items():
        for axis, size in enumerate(store):
            if size < graph[node_id].shape[axis]:
                classes.prefer((node_id, axis), size)

    def chunk_of(node_id: str) -> tuple[int, ...]:
        node = graph[node_id]
        if node.op == "concat":
            axis = node.attr("axis")
            return tuple(max(concat_chunk(node, axis), merge_limit(node, axis)) if a == axis
                         else classes.chunk((node_id, a)) for a in range(node.ndim))
        return tuple(classes.chunk((node_id, a)) for a in range(node.ndim))

    def merge_limit(node: Node, axis: int) -> int:
        """How long a run of small pieces one chunk of a concat may join along its axis:
        what the smallest chunk made for parallelism holds (`min_chunk_bytes`, the other
        axes at their chunk sizes), and no more than the concat's own class allows (memory
        fitting halves it). A chunk never splits a piece, so a longer piece is a chunk."""
        row = dtypes.itemsize(node.dtype) * math.prod(
            classes.chunk((node.id, a)) for a in range(node.ndim) if a != axis)
        return max(1, min(classes.chunk((node.id, axis)), config.min_chunk_bytes // max(1, row)))

    measured: dict = {}  # (concat id, axis) -> concat_chunk, while no chunk size changes
    measured_at = [0]

    def concat_chunk(node: Node, axis: int) -> int:
        """The largest piece a concat joins along its axis: its operands' chunks, seen
        through concats along the same axis (whose chunks may join pieces up to their
        `merge_limit`). The walk keeps its own stack (a chain of thousands of concats is
        deeper than Python's recursion limit) and stops at concats already measured since
        chunk sizes last changed, so the passes below, which visit operands before users,
        measure a chain of n concats in O(n), not O(n^2)."""
        if measured_at[0] != classes.halvings:
            measured.clear()
            measured_at[0] = classes.halvings
        if (node.id, axis) in measured:
            return measured[(node.id, axis)]
        largest, stack, seen = 0, [node], {node.id}
        while stack:
            for i in stack.pop().inputs:
                src = graph[i]
                if src.op != "concat" or src.attr("axis") != axis:
                    largest = max(largest, classes.chunk((i, axis)))
                elif (i, axis) in measured:
                    largest = max(largest, measured[(i, axis)])
                elif i not in seen:
                    seen.add(i)
                    stack.append(src)
                    largest = max(largest, merge_limit(src, axis))
        measured[(node.id, axis)] = largest
        return largest

    def space_chunk(node: Node):
        return tuple(classes.chunk((node.id + "#in", a))
                     for a in range(len(space_shapes[node.id])))

    def task_keys(node: Node) -> list:
        """The class keys whose chunk sizes set the node's task working set."""
        kind = get_op(node.op).kind
        if kind == REDUCE:
            return [(node.id + "#in", a) for a in range(len(space_chunk(node)))]
        keys = [(node.id, a) for a in range(node.ndim)]
        if kind == MATMUL:
            keys.append((node.id + "#k", 0))
        if node.op == "concat":
            keys += [(i, node.attr("axis")) for i in node.inputs]
        return keys

    def peak(node: Node) -> int:
        ins = [graph[i] for i in node.inputs]
        kind = get_op(node.op).kind
        k = classes.chunk((node.id + "#k", 0)) if kind == MATMUL else None
        space = space_chunk(node) if kind == REDUCE else None
        cost = main_cost(node, ins, chunk_of, space, k)
        ws = cost.working_set
        if kind in (MATMUL, REDUCE):
            ws = max(ws, combine_cost(cost.bytes_out if kind == REDUCE else
                                      _bytes(chunk_of(node.id), node.dtype), 2))
        return ws

    # 2. Split until every task fits.
    spatial = {classes.find((n.id, a)) for n in nodes if get_op(n.op).kind == WINDOW
               for a in range(2, n.ndim)}  # a window's spatial axes: split last (halos)
    # A scanned axis split adds a total and a carry per line of chunks, and has its chunks
    # read twice (their totals, then their scans): split last too.
    scanned = {classes.find((n.id, n.attr("axis"))) for n in nodes if get_op(n.op).kind == SCAN}
    changed = True
    while changed:
        changed = False
        for node in nodes:
            while (ws := peak(node)) > budget:
                candidates = [k for k in task_keys(node) if classes.splittable(k)]
                if not candidates:
                    reasons = sorted({r for k in task_keys(node)
                                      if (r := classes.whole_reason(k)) and
                                      classes.extent[classes.find(k)] > 1})
                    raise PlanError(_too_big(node, ws, budget, cluster, reasons))
                # an image is cut into spatial pieces, a scanned line into pieces, only when
                # one image, one line does not fit
                cheap = [k for k in candidates if classes.find(k) not in spatial | scanned]
                classes.halve(max(cheap or candidates, key=classes.chunk))
                changed = True

    # 3. Split large tensors further so every worker thread has work. Splitting an axis that
    # some node sums over (matmul's K, a reduced axis) adds partial results to combine and
    # move, so those classes are split for parallelism only when nothing else is left.
    summed = {classes.find((n.id + "#k", 0)) for n in nodes if get_op(n.op).kind == MATMUL}
    summed |= scanned
    for n in nodes:
        if get_op(n.op).kind == REDUCE:
            summed |= {classes.find((n.id + "#in", a)) for a in n.attr("axes")}
    # Splitting a stored array across its stored chunks costs nothing extra; splitting it
    # where a stored chunk spans the axis reads each stored chunk again per piece. So for
    # parallelism the first are preferred (even when summed over) and the second avoided.
    aligned = {classes.find((i, a)) for i, store in stored.items() for a, size in
               enumerate(store) if size < graph[i].shape[a]}
    rereads = {classes.find((i, a)) for i, store in stored.items() for a, size in
               enumerate(store) if size >= graph[i].shape[a] > 1}
    # A window's spatial axes, split, read halos twice: a last resort too; so is a scanned
    # axis, stored chunks or not (its other axes split along their stored chunks for free).
    costly = (summed - aligned) | (rereads - aligned) | spatial | scanned
    # Below its stored chunk a piece decodes the whole stored chunk anyway: parallelism
    # never splits a stored axis finer than that (memory fitting still may).
    floor = {}
    for i, store in stored.items():
        for a, size in enumerate(store):
            root = classes.find((i, a))
            floor[root] = max(floor.get(root, 0), size)
    # Sources that feed nodes sharing their axes take their grid from those users: splitting
    # a cheap source for its own sake would only cut its users' tiles smaller.
    target = cluster.total_threads * config.chunks_per_thread
    users = graph.consumers()
    link = cluster.typical_link

    def link_seconds(nbytes: int) -> float:
        return link.latency + nbytes / link.bandwidth

    # The labels the registry measures tasks under: with the sources read inside them.
    inline = predicted_inline(graph) if any(w.speeds for w in cluster.workers) else {}
    labels = {n.id: speed_label(n, [graph[i] for i in inline.get(n.id, ())]) for n in nodes}

    def task_cost(node: Node):
        ins = [graph[i] for i in node.inputs]
        kind = get_op(node.op).kind
        k = classes.chunk((node.id + "#k", 0)) if kind == MATMUL else None
        return main_cost(node, ins, chunk_of, space_chunk(node) if kind == REDUCE else None, k)

    def known_seconds(node: Node, cost) -> float | None:
        """A task's measured seconds, its speed label's work counted as it was measured: the
        task's own and, per task, a chunk of each source it reads inside (`Plan.stats`)."""
        flops, moved = cost.flops, cost.bytes_in + cost.bytes_out
        for source in inline.get(node.id, ()):
            read = main_cost(graph[source], [], chunk_of)
            flops, moved = flops + read.flops, moved + read.bytes_out
        return measured_task_seconds(labels[node.id], flops, moved, cluster)

    def small_operand(node: Node) -> bool:
        """Whether reading one operand once per task of the target count adds under a
        quarter of the bytes the matmul reads anyway."""
        sizes = [_bytes(graph[i].shape, graph[i].dtype) for i in node.inputs[:2]]
        return min(sizes) * target * 4 <= sum(sizes)

    evened: set = set()  # classes `_even_out` has looked at or leaves alone
    for node in nodes:
        kind = get_op(node.op).kind
        if (kind == LAYOUT and node.op != "transpose") or (
                kind == SOURCE and any(_shares_grid(graph[u]) for u in users[node.id])):
            continue
        keys = ([(node.id + "#in", a) for a in range(len(space_chunk(node)))]
                if get_op(node.op).kind == REDUCE else [(node.id, a) for a in range(node.ndim)])
        itemsize = dtypes.itemsize(node.dtype)
        last = None  # (class key, its chunk size before) of the last halving here
        while True:
            sizes = [classes.chunk(k) for k in keys]
            tasks = math.prod(-(-classes.extent[classes.find(k)] // max(1, s))
                              for k, s in zip(keys, sizes))
            chunk_bytes = math.prod(sizes) * itemsize
            candidates = [k for k in keys if classes.splittable(k)
                          and classes.chunk(k) > floor.get(classes.find(k), 0)]
            # A matmul's every extra tile reads a whole block of the other operand again, and
            # its tasks are long and even: half the tasks per thread do, unless one operand
            # is small enough (a layer's weights) that reading it again costs nothing.
            wanted = (max(cluster.total_threads, target // 2)
                      if kind == MATMUL and not small_operand(node) else target)
            if tasks >= wanted or chunk_bytes < 2 * config.min_chunk_bytes or not candidates:
                break
            # Halving makes tasks of half the time: not below what a task costs to run,
            # where the registry has measured how long this node's tasks take.
            cost = task_cost(node)
            known_s = known_seconds(node, cost)
            if known_s is not None and known_s / 2 < config.min_task_seconds:
                break
            free = [k for k in candidates if classes.find(k) not in costly]
            if not free and kind in (MATMUL, REDUCE) and known_s is not None:
                # A summed axis split once more gives each result chunk another partial to
                # move and add: worth it only while moving it is small against the work.
                partial = cost.bytes_out if kind == REDUCE else _bytes(chunk_of(node.id),
                                                                       node.dtype)
                if COMPUTE_PER_COMM * link_seconds(partial) > known_s / 2:
                    break
            key = max(free or candidates, key=classes.chunk)
            last = (key, classes.chunk(key))
            classes.halve(key)
            evened.add(classes.find(key))  # sized for parallelism (`_balance`), not memory
        if last is not None:
            _balance(classes, *last, keys, cluster.total_threads)
        else:
            for key in keys:
                if classes.find(key) not in evened:  # once: each shrink is measured from
                    evened.add(classes.find(key))    # the size memory left
                    _even_out(classes, key, keys, cluster.total_threads)

    # 5. Count the tasks before any chunk list is built.
    fanin, counts, n_chunks = {}, {}, {}
    for node in nodes:
        kind = get_op(node.op).kind
        n_chunks[node.id] = tuple(
            _joined_count(extent, merge_limit(node, a), [n_chunks[i][a] for i in node.inputs])
            if node.op == "concat" and a == node.attr("axis") else
            _count(extent, classes.chunk((node.id, a))) for a, extent in enumerate(node.shape))
        n_out = math.prod(n_chunks[node.id])
        along = n_chunks[node.id][node.attr("axis")] if kind == SCAN else 1
        if kind == REDUCE:
            partial = main_cost(node, [graph[i] for i in node.inputs], chunk_of,
                                space_chunk(node)).bytes_out
            fanin[node.id] = _fanin(partial, budget, config)
            n_main = math.prod(_count(e, classes.chunk((node.id + "#in", a)))
                               for a, e in enumerate(space_shapes[node.id]))
        elif kind == MATMUL:
            fanin[node.id] = _fanin(_bytes(chunk_of(node.id), node.dtype), budget, config)
            k = graph[node.inputs[0]].shape[-1]
            n_main = n_out * _count(k, classes.chunk((node.id + "#k", 0)))
        else:
            n_main = n_out
        counts[node.id] = task_count(kind, n_main, n_out, fanin.get(node.id, 2), along)
    if sum(counts.values()) > config.max_tasks:
        raise _TooManyTasks(_too_many(graph, counts, config.max_tasks, cluster))

    chunks: dict[str, Chunks] = {}
    for node in nodes:
        if node.op == "concat":
            axis = node.attr("axis")
            along = join_pieces(sum((chunks[i][axis] for i in node.inputs), ()),
                                merge_limit(node, axis))
            chunks[node.id] = tuple(along if a == axis else
                                    regular_chunks(e, classes.chunk((node.id, a)))
                                    for a, e in enumerate(node.shape))
        else:
            chunks[node.id] = tuple(regular_chunks(e, classes.chunk((node.id, a)))
                                    for a, e in enumerate(node.shape))
    spaces, k_chunks = {}, {}
    for node in nodes:
        kind = get_op(node.op).kind
        if kind == REDUCE:
            spaces[node.id] = tuple(regular_chunks(e, classes.chunk((node.id + "#in", a)))
                                    for a, e in enumerate(space_shapes[node.id]))
        elif kind == MATMUL:
            k_chunks[node.id] = regular_chunks(graph[node.inputs[0]].shape[-1],
                                               classes.chunk((node.id + "#k", 0)))
    return Partition(graph, chunks, spaces, k_chunks, budget, fanin)


def join_pieces(pieces: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """A concat's chunks along its axis: its operands' chunks (`pieces`) in order, each run
    of pieces that together hold at most `limit` joined into one chunk (one task reads
    them all), empty pieces dropped (an empty axis is one empty chunk). A 5,000-way concat
    of rows is then a few tasks, not 5,000, each a scheduler round trip."""
    out: list[int] = []
    run = 0
    for piece in pieces:
        if run and run + piece > limit:
            out.append(run)
            run = 0
        run += piece
    if run or not out:
        out.append(run)
    return tuple(out)


def _joined_count(extent: int, limit: int, pieces: list[int]) -> int:
    """At most how many chunks `join_pieces` makes of `pieces` (each operand's chunk count)
    along an axis of `extent`: no more than the pieces, and, since two neighbouring chunks
    together always hold more than `limit`, no more than 2 * (extent // (limit + 1)) + 1."""
    return min(sum(pieces), 2 * (extent // (limit + 1)) + 1)


def task_count(kind: str, n_main: int, n_out: int, fanin: int, along: int = 1) -> int:
    """Tasks of one node: its `n_main` main tasks (one per chunk of the result; per chunk of
    the reduced space for a reduction; per tile and K chunk for a matmul), and for
    reductions and matmuls whose main tasks leave several partials per result chunk, the
    tree that combines them (`fanin` at a time) and one finishing task per result chunk (a
    reduction's only partial of a result chunk is computed inside its finish: one task).
    A scan with `along` chunks along its axis has, per line of them, a total of each chunk
    but the last in scan order and a carry of each from the third on (`lower`)."""
    if kind == SCAN:
        return n_out + n_out // along * (max(0, along - 1) + max(0, along - 2))
    tasks = n_main
    if kind == REDUCE and n_main == n_out:
        return n_out
    if kind == REDUCE or (kind == MATMUL and n_main > n_out):
        parts, tree = n_main // n_out, 0
        while parts > fanin:
            parts = -(-parts // fanin)
            tree += parts
        tasks += n_out * (tree + 1)
    return tasks


def _balance(classes: _Classes, key, before: int, keys: list, threads: int) -> None:
    """Grow a class halved for parallelism back, in steps of its stored chunk, to the size
    that finishes soonest on `threads` threads (`before` is its size before the halving,
    which fitted). Chunk sizes rounded to stored chunks make uneven counts: 2,000 planes in
    stored chunks of 62 halved to 186 are 11 tasks, 6 on one thread of two, where 248 makes
    9 that end together; 30.5 stored chunks of rows in tasks of 4 end 5% later than in tasks
    of 5. On a tie the smaller chunks stay (finer tasks balance better on a busy worker)."""
    root = classes.find(key)
    step = classes.step.get(root, 1)
    extent = classes.extent[root]
    others = math.prod(_count(classes.extent[classes.find(k)], classes.chunk(k))
                       for k in keys if classes.find(k) != root)
    # Beyond a few tasks per thread the last one's unevenness is small; and a node with two
    # axes in this class (x + x.T) is left alone, its tasks not being counted here.
    if step <= 1 or sum(classes.find(k) == root for k in keys) > 1 or \
            _count(extent, classes.chunk(key)) * others > 16 * threads:
        return
    best, best_time = classes.chunk(key), None
    sizes = sorted({-(-(-(-extent // n)) // step) * step
                    for n in range(1, _count(extent, best) + 1)} | {best})
    for size in (s for s in sizes if best <= s < before):
        finish = _finish_time(extent, size, others, threads)
        if best_time is None or finish < best_time:
            best, best_time = size, finish
    if best != classes.size[root]:
        classes.size[root] = best
        classes.halvings += 1  # chunk sizes changed (`concat_chunk` caches on this)


def _even_out(classes: _Classes, key, keys: list, threads: int) -> None:
    """Make a class that memory alone cut (no halving for parallelism) a little smaller,
    in steps of its stored chunk, where its tasks then end sooner on `threads` threads: 1M
    images in stored chunks of 8,192 that fit in tasks of 65,536 are 15 full tasks and a
    small one, 8 rounds on one thread of two; in tasks of 49,152 both threads end after
    10.3 rounds of that size, 3% sooner. On a tie the larger chunks stay (fewer tasks)."""
    root = classes.find(key)
    step = classes.step.get(root, 1)
    extent, size = classes.extent[root], classes.chunk(key)
    if step <= 1 or size >= extent or sum(classes.find(k) == root for k in keys) > 1:
        return
    others = math.prod(_count(classes.extent[classes.find(k)], classes.chunk(k))
                       for k in keys if classes.find(k) != root)
    if _count(extent, size) * others > 16 * threads:
        return
    best, best_time = size, _finish_time(extent, size, others, threads)
    for smaller in range(size - step, size // 2, -step):
        finish = _finish_time(extent, smaller, others, threads)
        if finish < best_time:
            best, best_time = smaller, finish
    if best != size:
        classes.size[root] = best
        classes.halvings += 1  # chunk sizes changed (`concat_chunk` caches on this)


def _finish_time(extent: int, size: int, others: int, threads: int) -> int:
    """When the last of `others` rows of tasks along an axis of `extent` in chunks of `size`
    ends, longest first to the least loaded of `threads` (in units of the axis)."""
    full, rest = divmod(extent, size)
    rounds, extra = divmod(full * others, threads)
    loads = [(rounds + 1) * size] * extra + [rounds * size] * (threads - extra)
    heapq.heapify(loads)
    for _ in range(others if rest else 0):
        heapq.heapreplace(loads, loads[0] + rest)
    return max(loads)


def _count(extent: int, size: int) -> int:
    """How many chunks `regular_chunks(extent, size)` makes."""
    return -(-extent // size) if extent else 1


def _too_many(graph: Graph, counts: dict[str, int], limit: int, cluster: ClusterSpec) -> str:
    worst = max(graph.nodes, key=lambda n: counts[n.id])
    return (f"the plan has {sum(counts.values()):,} tasks, more than the limit of {limit:,} "
            f"(DEEPX_MAX_TASKS); node '{worst.id}' ({worst.op}, shape {worst.shape}, "
            f"{worst.dtype}) alone has {counts[worst.id]:,} on cluster '{cluster.name}'. Make "
            f"the tensors smaller, plan for workers with more memory, or raise "
            f"DEEPX_MAX_TASKS if the scheduler can hold the graph")


# Compute per unit of communication a split of a summed axis must keep (the design's
# compute/communication ratio above 10).
COMPUTE_PER_COMM = 10


def _shares_grid(node: Node) -> bool:
    """Whether `node` joins its operands' axes with its own (so it sets their grid)."""
    return get_op(node.op).kind != LAYOUT or node.op == "transpose"


def _bytes(shape, dtype) -> int:
    return math.prod(shape) * dtypes.itemsize(dtype)


def _fanin(partial_bytes: int, budget: int, config: Settings) -> int:
    """The widest tree-reduction step that fits the budget (at least 2)."""
    fits = budget // max(1, partial_bytes) - 1
    return max(2, min(config.reduce_fanin, fits))


def _too_big(node: Node, ws: int, budget: int, cluster: ClusterSpec, reasons) -> str:
    why = f"; an axis must stay whole for {', '.join(reasons)}" if reasons else ""
    return (f"node '{node.id}' ({node.op}, shape {node.shape}, {node.dtype}) cannot fit: its "
            f"smallest task needs {format_bytes(ws)} but a task may use "
            f"{format_bytes(budget)} on cluster '{cluster.name}' (worker memory x "
            f"memory_fraction / threads){why}. Use workers with more memory or fewer threads, "
            f"or make the axes that must stay whole smaller")
