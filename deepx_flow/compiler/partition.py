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
5. Parameters placed in pieces over the workers (`splits`, input id -> (axis, pieces): the
   placement pass's sharded parameters) start with their axis's class in that many chunks,
   which parallelism never splits further (memory fitting still may: then each worker owns
   several). Everything chunked alike with them (a matmul's K, their gradient, their
   optimizer state) follows.
6. The plan's tasks (`task_count`, the figure `Plan.stats` reports) are counted from the
   chunk sizes before any list of chunks is built, so a grid of billions of chunks is refused
   at once instead of filling the driver's memory.

Every difference between kinds of operator is in their rules (`compiler/chunking/`, one
file per kind): which axes each joins, keeps whole or sums over, what sets its tasks'
memory, and how many tasks and chunks it makes. The driver below only walks the graph.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from deepx_flow.compiler.chunking import Chunking, rule_for
from deepx_flow.compiler.chunking.classes import Classes, count
from deepx_flow.compiler.costs import main_cost, measured_task_seconds
from deepx_flow.compiler.inline import predicted_inline
from deepx_flow.config import Settings, settings
from deepx_flow.errors import PlanError
from deepx_flow.ir import Graph, Node, dtypes
from deepx_flow.ir.program import speed_label
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
    splits: dict[str, tuple[int, int]] = field(default_factory=dict)  # input -> (axis, pieces)
    # Filled by lowering: node id -> the token of its operator, attributes and chunking, the
    # part of its keys that is the same every time this plan is lowered.
    node_tokens: dict[str, str] = field(default_factory=dict, init=False, compare=False,
                                        repr=False)


def partition_graph(graph: Graph, cluster: ClusterSpec, config: Settings | None = None,
                    splits: dict[str, tuple[int, int]] | None = None) -> Partition:
    """Pick chunk grids for every tensor of `graph`; see the module docstring.

    A whole axis (softmax's) is first joined with its operand's axis, so no task has to
    assemble rows. When that cannot fit, for example because two softmaxes read one tensor
    along different axes, the plan is made again with those axes left free.
    """
    config = config or settings()
    splits = _checked_splits(graph, splits or {})
    try:
        return _partition(graph, cluster, config, True, splits)
    except PlanError as err:
        # Freeing whole axes helps tasks fit; it never makes fewer of them.
        if isinstance(err, _TooManyTasks) or not any(rule_for(n).frees_whole_axis
                                                     for n in graph.nodes):
            raise
    return _partition(graph, cluster, config, False, splits)


def _checked_splits(graph: Graph, splits: dict) -> dict[str, tuple[int, int]]:
    """`splits`, each naming an input of the graph, an axis of it and 1 to extent pieces."""
    out = {}
    for input_id, (axis, pieces) in sorted(splits.items()):
        node = graph[input_id] if input_id in graph else None
        if node is None or node.inputs:
            raise PlanError(f"a split names {input_id!r}, which is not a source of the graph")
        if not 0 <= axis < node.ndim or not 1 <= pieces <= node.shape[axis]:
            raise PlanError(f"input {input_id!r} {node.shape} cannot be split in {pieces} "
                            f"pieces along axis {axis}")
        out[input_id] = (int(axis), int(pieces))
    return out


def joined_axes(graph: Graph, config: Settings, budget: int, join_whole_axes: bool = True,
                splits: dict[str, tuple[int, int]] | None = None) -> Chunking:
    """Step 1: every axis (and each index space a rule names) in a class, each class whole,
    the axes chunked alike joined by the rules, and stored arrays' chunks preferred; the
    classes of split inputs' axes in their pieces (`splits`, checked)."""
    rules = {n.id: rule_for(n) for n in graph.nodes}
    s = Chunking(graph, config, rules, budget)
    for node in graph.nodes:
        s.spaces.update(rules[node.id].spaces(node, s.inputs(node)))
    for node in graph.nodes:
        for axis, extent in enumerate(node.shape):
            s.classes.add((node.id, axis), extent)
    for node in graph.nodes:
        rules[node.id].join(node, s.inputs(node), s, join_whole_axes)
    # Stored arrays read fastest in their own chunks: chunk sizes along their chunked axes
    # are kept to multiples of the stored chunk while that fits.
    for node in graph.nodes:
        for axis, size in enumerate(rules[node.id].stored_chunks(node) or ()):
            if size < node.shape[axis]:
                s.classes.prefer((node.id, axis), size)
    for input_id, (axis, pieces) in (splits or {}).items():
        key = (input_id, axis)
        if s.classes.whole_reason(key):
            raise PlanError(f"input {input_id!r} cannot be split along axis {axis}: "
                            f"{s.classes.whole_reason(key)} keeps it whole")
        s.classes.split_in(key, pieces)
    return s


class _TooManyTasks(PlanError):
    """The plan is over the task limit (a PlanError to every caller)."""


def _partition(graph: Graph, cluster: ClusterSpec, config: Settings, join_whole_axes: bool,
               splits: dict[str, tuple[int, int]]) -> Partition:
    s = joined_axes(graph, config, cluster.task_budget(config), join_whole_axes, splits)
    nodes, rules, classes, budget = graph.nodes, s.rules, s.classes, s.budget
    stored = {n.id: store for n in nodes if (store := rules[n.id].stored_chunks(n))}

    def peak(node: Node) -> int:
        return rules[node.id].peak(node, s.inputs(node), s)

    # 2. Split until every task fits. An image is cut into spatial pieces, a scanned line
    # into pieces, only when one image, one line does not fit (`Rule.split_last`).
    split_last = {classes.find(k) for n in nodes for k in rules[n.id].split_last(n)}
    changed = True
    while changed:
        changed = False
        for node in nodes:
            while (ws := peak(node)) > budget:
                keys = rules[node.id].task_keys(node, s)
                candidates = [k for k in keys if classes.splittable(k)]
                if not candidates:
                    reasons = sorted({r for k in keys if (r := classes.whole_reason(k)) and
                                      classes.extent[classes.find(k)] > 1})
                    raise PlanError(_too_big(node, ws, budget, cluster, reasons))
                cheap = [k for k in candidates if classes.find(k) not in split_last]
                classes.halve(max(cheap or candidates, key=classes.chunk))
                changed = True

    # 3. Split large tensors further so every worker thread has work. Splitting an axis that
    # some node sums over (matmul's K, a reduced axis) adds partial results to combine and
    # move, so those classes are split for parallelism only when nothing else is left.
    summed = {classes.find(k) for n in nodes for k in rules[n.id].summed(n)}
    # Splitting a stored array across its stored chunks costs nothing extra; splitting it
    # where a stored chunk spans the axis reads each stored chunk again per piece. So for
    # parallelism the first are preferred (even when summed over) and the second avoided.
    aligned = {classes.find((i, a)) for i, store in stored.items() for a, size in
               enumerate(store) if size < graph[i].shape[a]}
    rereads = {classes.find((i, a)) for i, store in stored.items() for a, size in
               enumerate(store) if size >= graph[i].shape[a] > 1}
    # What is split last for memory is a last resort here too, stored chunks or not.
    costly = (summed - aligned) | (rereads - aligned) | split_last
    # Below its stored chunk a piece decodes the whole stored chunk anyway: parallelism
    # never splits a stored axis finer than that (memory fitting still may).
    floor = {}
    for i, store in stored.items():
        for a, size in enumerate(store):
            root = classes.find((i, a))
            floor[root] = max(floor.get(root, 0), size)
    # A split input's pieces are one per worker: parallelism cuts them no finer.
    for input_id, (axis, _) in splits.items():
        root = classes.find((input_id, axis))
        floor[root] = max(floor.get(root, 0), classes.chunk(root))
    target = cluster.total_threads * config.chunks_per_thread
    users = graph.consumers()
    link = cluster.typical_link

    def link_seconds(nbytes: int) -> float:
        return link.latency + nbytes / link.bandwidth

    # The labels the registry measures tasks under: with the sources read inside them.
    inline = predicted_inline(graph) if any(w.speeds for w in cluster.workers) else {}
    labels = {n.id: speed_label(n, [graph[i] for i in inline.get(n.id, ())]) for n in nodes}

    def known_seconds(node: Node, cost) -> float | None:
        """A task's measured seconds, its speed label's work counted as it was measured: the
        task's own and, per task, a chunk of each source it reads inside (`Plan.stats`)."""
        flops, moved = cost.flops, cost.bytes_in + cost.bytes_out
        for source in inline.get(node.id, ()):
            read = main_cost(graph[source], [], s.chunk_of)
            flops, moved = flops + read.flops, moved + read.bytes_out
        return measured_task_seconds(labels[node.id], flops, moved, cluster)

    evened: set = set()  # classes `_even_out` has looked at or leaves alone
    for node in nodes:
        rule = rules[node.id]
        if not rule.sets_grid or (rule.follows_users and any(
                rules[u].sets_grid for u in users[node.id])):
            continue  # its grid is its operands' or its users'
        keys = rule.grid_keys(node, s)
        itemsize = dtypes.itemsize(node.dtype)
        last = None  # (class key, its chunk size before) of the last halving here
        while True:
            sizes = [classes.chunk(k) for k in keys]
            tasks = math.prod(-(-classes.extent[classes.find(k)] // max(1, size))
                              for k, size in zip(keys, sizes))
            chunk_bytes = math.prod(sizes) * itemsize
            candidates = [k for k in keys if classes.splittable(k)
                          and classes.chunk(k) > floor.get(classes.find(k), 0)]
            wanted = rule.wanted_tasks(node, s, target, cluster.total_threads)
            if tasks >= wanted or chunk_bytes < 2 * config.min_chunk_bytes or not candidates:
                break
            # Halving makes tasks of half the time: not below what a task costs to run,
            # where the registry has measured how long this node's tasks take.
            cost = rule.cost(node, s.inputs(node), s)
            known_s = known_seconds(node, cost)
            if known_s is not None and known_s / 2 < config.min_task_seconds:
                break
            free = [k for k in candidates if classes.find(k) not in costly]
            partial = rule.partial_bytes(node, cost, s) if not free else None
            if partial is not None and known_s is not None:
                # A summed axis split once more gives each result chunk another partial to
                # move and add: worth it only while moving it is small against the work.
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
        n_chunks[node.id] = rules[node.id].chunk_counts(node, s, n_chunks)
        counts[node.id] = rules[node.id].tasks(node, s, n_chunks, fanin)
    if sum(counts.values()) > config.max_tasks:
        raise _TooManyTasks(_too_many(graph, counts, config.max_tasks, cluster))

    chunks: dict[str, Chunks] = {}
    planned: dict[str, dict] = {"spaces": {}, "k_chunks": {}}
    for node in nodes:
        chunks[node.id] = rules[node.id].chunks(node, s, chunks)
        for what, value in rules[node.id].planned(node, s).items():
            planned[what][node.id] = value
    return Partition(graph, chunks, planned["spaces"], planned["k_chunks"], budget, fanin,
                     splits)


def _balance(classes: Classes, key, before: int, keys: list, threads: int) -> None:
    """Grow a class halved for parallelism back, in steps of its stored chunk, to the size
    that finishes soonest on `threads` threads (`before` is its size before the halving,
    which fitted). Chunk sizes rounded to stored chunks make uneven counts: 2,000 planes in
    stored chunks of 62 halved to 186 are 11 tasks, 6 on one thread of two, where 248 makes
    9 that end together; 30.5 stored chunks of rows in tasks of 4 end 5% later than in tasks
    of 5. On a tie the smaller chunks stay (finer tasks balance better on a busy worker)."""
    root = classes.find(key)
    step = classes.step.get(root, 1)
    extent = classes.extent[root]
    others = math.prod(count(classes.extent[classes.find(k)], classes.chunk(k))
                       for k in keys if classes.find(k) != root)
    # Beyond a few tasks per thread the last one's unevenness is small; and a node with two
    # axes in this class (x + x.T) is left alone, its tasks not being counted here.
    if step <= 1 or sum(classes.find(k) == root for k in keys) > 1 or \
            count(extent, classes.chunk(key)) * others > 16 * threads:
        return
    best, best_time = classes.chunk(key), None
    sizes = sorted({-(-(-(-extent // n)) // step) * step
                    for n in range(1, count(extent, best) + 1)} | {best})
    for size in (s for s in sizes if best <= s < before):
        finish = _finish_time(extent, size, others, threads)
        if best_time is None or finish < best_time:
            best, best_time = size, finish
    if best != classes.size[root]:
        classes.size[root] = best
        classes.halvings += 1  # chunk sizes changed (`concat_chunk` caches on this)


def _even_out(classes: Classes, key, keys: list, threads: int) -> None:
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
    others = math.prod(count(classes.extent[classes.find(k)], classes.chunk(k))
                       for k in keys if classes.find(k) != root)
    if count(extent, size) * others > 16 * threads:
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


def _too_big(node: Node, ws: int, budget: int, cluster: ClusterSpec, reasons) -> str:
    why = f"; an axis must stay whole for {', '.join(reasons)}" if reasons else ""
    return (f"node '{node.id}' ({node.op}, shape {node.shape}, {node.dtype}) cannot fit: its "
            f"smallest task needs {format_bytes(ws)} but a task may use "
            f"{format_bytes(budget)} on cluster '{cluster.name}' (worker memory x "
            f"memory_fraction / threads){why}. Use workers with more memory or fewer threads, "
            f"or make the axes that must stay whole smaller")
