"""The compiled plan: the chunked graph, what its tasks cost, and `explain()`.

A `Plan` is what `dx.compile` returns. It holds the graph as the user wrote it, the fused
graph, the partition (chunk grids), and the cluster it was made for. `stats()` gives per-node
task counts and costs and the compute/communication estimate; `explain()` prints them as
tables. Lowering to a Dask graph happens when a run binds the inputs (`Plan.lower`).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from deepx_flow.compiler import batch_chain
from deepx_flow.compiler.batch_chain import all_chains
from deepx_flow.compiler.costs import combine_cost, main_cost, measured_task_seconds
from deepx_flow.compiler.chunking import task_count
from deepx_flow.compiler.inline import (finished_by_reader, main_tasks,
                                        predicted_inline)
from deepx_flow.compiler.lower import Lowered, lower_partition
from deepx_flow.compiler.partition import Partition
from deepx_flow.ir import Graph, dtypes
from deepx_flow.ir.program import describe, speed_label
from deepx_flow.ops import MATMUL, REDUCE, SCAN, get_op
from deepx_flow.registry.cluster import ClusterSpec, format_bytes
from deepx_flow.terminal_text import escaped
from deepx_flow.text_table import html_table, text_table


@dataclass(frozen=True)
class NodeStats:
    node: str
    op: str
    tasks: int            # all tasks of the node, tree-reduction steps included
    peak_working_set: int
    flops: float
    bytes_in: int
    bytes_out: int
    comm_bytes: float     # expected bytes moved between workers


@dataclass(frozen=True)
class PlanStats:
    nodes: tuple[NodeStats, ...]
    tasks: int
    flops: float
    comm_bytes: float
    compute_seconds: float
    comm_seconds: float

    @property
    def compute_comm_ratio(self) -> float:
        return self.compute_seconds / self.comm_seconds if self.comm_seconds else math.inf


@dataclass(frozen=True)
class Plan:
    """A graph compiled for a cluster: chunk grids, task costs, and the lowering."""

    graph: Graph
    fused: Graph
    partition: Partition
    cluster: ClusterSpec

    @property
    def chunks(self) -> dict:
        """Node id -> chunk sizes along each axis (Dask style)."""
        return self.partition.chunks

    def lower(self, sources: dict, to_host: bool = False, inline: bool = True) -> Lowered:
        """The Dask graph of this plan with `sources` bound to its inputs."""
        return lower_partition(self.partition, sources, to_host, inline)

    @property
    def chains(self) -> tuple[dict[str, str], dict[str, str]]:
        """(batch chains, matmul chains) (`compiler.batch_chain.all_chains`), found once per
        plan (the stats and every run ask)."""
        chains = self.__dict__.get("_chains")
        if chains is None:
            chains = all_chains(self.fused, self.partition)
            object.__setattr__(self, "_chains", chains)  # frozen: a memo, not a field
        return chains

    @property
    def chained(self) -> dict[str, str]:
        """Nodes computed inside a later node's tasks (the layers of batch chains and matmul
        chains), as node id -> that node."""
        batch, matmuls = self.chains
        return {**batch, **matmuls}

    def stats(self) -> PlanStats:
        """Per-node tasks and costs, and the compute/communication estimate (worked out
        once per plan: a run asks for them several times, and a plan never changes)."""
        stats = self.__dict__.get("_stats")
        if stats is None:
            stats = self._stats()
            object.__setattr__(self, "_stats", stats)  # frozen: a memo, not a field
        return stats

    def _stats(self) -> PlanStats:
        part, graph, cluster = self.partition, self.fused, self.cluster
        workers = len(cluster.workers)
        remote = (workers - 1) / workers if workers > 1 else 0.0
        rows = []
        # Sources read inside their reader's tasks, and transposes and reshapes of whole
        # chunks (views, computed by their readers), have no tasks of their own: a source's
        # work is its reader's.
        inline = predicted_inline(graph, part)
        inside = {s for sources in inline.values() for s in sources}
        outputs = {node_id for _, node_id in graph.outputs}
        views = {n.id for n in graph.nodes if n.id not in outputs and (
            n.op == "transpose" or (n.op == "reshape" and _reshapes_whole_chunks(n, part)))}
        chained = self.chained  # nodes computed in a later one's tasks
        batch_ends = set(self.chains[0].values())
        # Nothing moves to read these: they are computed where they are read.
        local = inside | set(chained) | {v for v in views if graph[v].inputs[0] in inside}
        folded: dict = {}  # node id -> (FLOPs, bytes) of the sources it reads inline
        users = graph.consumers()
        for node in graph.nodes:
            ins = [graph[i] for i in node.inputs]
            chunks = part.chunks[node.id]
            kind = get_op(node.op).kind

            def chunk_of(node_id):
                return tuple(max(c) if c else 0 for c in part.chunks[node_id])

            space = tuple(max(c) for c in part.spaces[node.id]) if kind == REDUCE else None
            k = max(part.k_chunks[node.id]) if kind == MATMUL else None
            cost = main_cost(node, ins, chunk_of, space, k)
            n_main = main_tasks(node, part)
            n_out = math.prod(len(c) for c in chunks)
            combines = max(0, n_main - n_out) if kind in (REDUCE, MATMUL) else 0
            fanin = part.fanin.get(node.id, 2)
            along = len(chunks[node.attr("axis")]) if kind == SCAN else 1
            n_tasks = task_count(kind, n_main, n_out, fanin, along)
            if kind == REDUCE and finished_by_reader(node, graph, part, users, outputs):
                n_tasks -= n_out  # each result chunk finished inside the task reading it
            peak = cost.working_set
            if node.id in batch_ends:  # the chain's task: `compiler.batch_chain`, one a chunk
                peak = batch_chain.working_set(
                    batch_chain.stages(node, graph, self.chains[0]), graph, part)
                n_tasks, combines = n_out, 0
            if combines:
                peak = max(peak, combine_cost(cost.bytes_out, fanin))
            # A task's largest operand is usually where it runs; the rest may be elsewhere.
            operand_bytes = [math.prod(chunk_of(t.id)) * dtypes.itemsize(t.dtype) for t in ins
                             if t.id not in local]
            moved = (sum(operand_bytes) - max(operand_bytes, default=0)) * n_main * remote
            moved += combines * cost.bytes_out * remote
            total_flops = cost.flops * n_main
            if node.id in inside or node.id in views or node.id in chained:
                if node.id in inside or node.id in chained:
                    reader = chained.get(node.id) or next(
                        r for r, sources in inline.items() if node.id in sources)
                    flops, nbytes = folded.get(reader, (0.0, 0))
                    own_flops, own_bytes = folded.get(node.id, (0.0, 0))
                    folded[reader] = (flops + total_flops + own_flops,
                                      nbytes + cost.bytes_out * n_main + own_bytes)
                rows.append(NodeStats(node.id, _label(node) + " (inside its reader's tasks)",
                                      0, 0, 0.0, 0, 0, 0.0))
                continue
            flops, nbytes = folded.get(node.id, (0.0, 0))
            rows.append(NodeStats(node.id, _label(node), n_tasks, peak, total_flops + flops,
                                  cost.bytes_in * n_main + nbytes, cost.bytes_out * n_main,
                                  moved))
        flops = sum(r.flops for r in rows)
        # Nodes whose operator every worker has measured (`registry/speeds.py`) take the
        # measured time, shared among the threads; the others are estimated from rates.
        measured_s, estimated = 0.0, []
        # A task's label names what it computes inside, as the run records it: the sources
        # it reads, and the matmuls chained into it with the sources they read.
        inside_of = {n.id: set(inline.get(n.id, ())) for n in graph.nodes}
        for c, reader in chained.items():
            inside_of[reader] |= {c} | set(inline.get(c, ()))
        for r, n in zip(rows, graph.nodes):
            seconds = _measured_task_seconds(n, r, cluster,
                                             [graph[i] for i in sorted(inside_of[n.id])])
            if seconds is None:
                estimated.append((r, n))
            else:
                measured_s += seconds * r.tasks / cluster.total_threads
        # Matmul arithmetic runs at BLAS speed; everything else is counted in elementwise
        # operations, which NumPy runs far below the machine's peak FLOP rate.
        dense = sum(r.flops for r, n in estimated if get_op(n.op).kind == MATMUL)
        rest = sum(r.flops for r, _ in estimated) - dense
        touched = sum(r.bytes_in + r.bytes_out for r, _ in estimated)
        compute_rate = sum(w.compute_rate for w in cluster.workers)
        elementwise_rate = sum(w.elementwise_rate for w in cluster.workers)
        memory_rate = sum(w.memory_rate for w in cluster.workers)
        compute_s = measured_s + max(dense / compute_rate + rest / elementwise_rate,
                                     touched / memory_rate)
        comm_bytes = sum(r.comm_bytes for r in rows)
        comm_s = comm_bytes / (cluster.transfer_bandwidth * workers)
        return PlanStats(tuple(rows), sum(r.tasks for r in rows), flops, comm_bytes, compute_s,
                         comm_s)

    def explain(self) -> str:
        """Tables of tensors (shape, chunk shape, chunks), task kinds and totals."""
        title, tensors, tasks, totals = self._explained()
        tensors = [row[:-1] for row in tensors]  # the grid is for the notebook's table
        # Names are shown with their control characters escaped (`terminal_text`).
        return "\n".join([escaped(title), "", text_table(tensors[0], tensors[1:]), "",
                          text_table(tasks[0], tasks[1:]), ""] + totals)

    def __repr__(self) -> str:
        stats = self.stats()
        return (f"<Plan for cluster '{escaped(self.cluster.name)}': "
                f"{len(self.fused.nodes)} tensors, "
                f"{stats.tasks:,} tasks, {stats.flops / 1e9:.3f} GFLOP, task budget "
                f"{format_bytes(self.partition.budget)}; plan.explain() prints its tables>")

    def _repr_html_(self) -> str:
        title, tensors, tasks, totals = self._explained()
        return (f"<div class=\"deepx-plan\">{html_table(tensors[0], tensors[1:], title)}"
                f"{html_table(tasks[0], tasks[1:])}<p>{'<br>'.join(map(html.escape, totals))}</p>"
                "</div>")

    def _explained(self) -> tuple[str, list, list, list[str]]:
        """The title, the tensors' rows (with each one's chunk grid last), the tasks' rows
        (each with its header row first) and the totals' lines of `explain`."""
        stats = self.stats()
        cluster = self.cluster
        title = (f"Plan for cluster '{cluster.name}': {len(cluster.workers)} worker(s), "
                 f"{cluster.total_threads} thread(s), task budget "
                 f"{format_bytes(self.partition.budget)}")
        tensors = [("tensor", "op", "shape", "dtype", "chunk shape", "chunks", "grid")]
        names = {node_id: name for name, node_id in self.graph.outputs}
        for node in self.fused.nodes:
            chunks = self.partition.chunks[node.id]
            label = node.id + (f" -> {names[node.id]}" if names.get(node.id, node.id) != node.id
                               else "")
            tensors.append((label, node.op, _shape(node.shape), node.dtype,
                            _shape(tuple(max(c) for c in chunks)),
                            str(math.prod(len(c) for c in chunks)),
                            " x ".join(str(len(c)) for c in chunks) or "1"))
        tasks = [("node", "task kind", "tasks", "peak working set", "GFLOP", "bytes in",
                  "bytes out")]
        for r in stats.nodes:
            tasks.append((r.node, r.op, str(r.tasks), format_bytes(r.peak_working_set),
                          f"{r.flops / 1e9:.3f}", format_bytes(r.bytes_in),
                          format_bytes(r.bytes_out)))
        ratio = stats.compute_comm_ratio
        totals = [f"Totals: {stats.tasks} tasks, {stats.flops / 1e9:.3f} GFLOP, "
                  f"{format_bytes(stats.comm_bytes)} between workers (estimated)",
                  f"Estimated compute {stats.compute_seconds:.4f} s, communication "
                  f"{stats.comm_seconds:.4f} s, compute/communication ratio "
                  f"{'inf' if ratio == math.inf else f'{ratio:.1f}'}"] + self._kept_reads(stats)
        return title, tensors, tasks, totals

    def _kept_reads(self, stats) -> list[str]:
        """A line per stored array read by several passes (a mean, then a transform): its
        chunks are read and decoded once, by tasks of their own, and each stays in its
        worker's memory until the last pass that reads it is done (Dask keeps a result while
        a task depends on it). A read with one reader is computed inside it instead."""
        tasks = {r.node: r for r in stats.nodes}
        lines = []
        for node in self.fused.nodes:
            row = tasks.get(node.id)
            if node.op != "read_zarr" or row is None or not row.tasks:
                continue
            readers = [n.id for n in self.fused.nodes if node.id in n.inputs]
            if len(readers) > 1:
                lines.append(f"{node.id}: read and decoded once, its {row.tasks} chunk(s) "
                             f"({format_bytes(row.bytes_out)}) kept on their workers for "
                             f"{len(readers)} readers")
        return lines


def _reshapes_whole_chunks(node, part) -> bool:
    """Whether each chunk of a reshape is one chunk of its operand, reshaped (a view the
    lowering computes in its readers): both in one chunk, or both chunked alike along a
    first axis they share (a flatten of images) and whole along the others."""
    source = part.graph[node.inputs[0]]
    mine, theirs = part.chunks[node.id], part.chunks[source.id]
    if all(len(c) == 1 for c in mine + theirs):
        return True
    return (node.ndim > 0 and source.ndim > 0 and node.shape[0] == source.shape[0]
            and mine[0] == theirs[0] and all(len(c) == 1 for c in mine[1:] + theirs[1:]))


def _label(node) -> str:
    if node.op == "fused":
        return "fused " + describe(node.attr("program"))
    if node.attr("epilogue"):
        return "matmul + " + describe(node.attr("epilogue"))
    if node.attr("prologue"):
        return f"{node.op} of " + describe(node.attr("prologue"))
    return node.op


def _shape(shape) -> str:
    return str(tuple(shape))


def _measured_task_seconds(node, stats, cluster, inlined=()) -> float | None:
    """One task of `node` (its mean work), by the speeds measured for its operator, averaged
    over the workers; None unless every worker has measured it."""
    if not stats.tasks:
        return None
    return measured_task_seconds(speed_label(node, inlined), stats.flops / stats.tasks,
                                 (stats.bytes_in + stats.bytes_out) / stats.tasks, cluster)

