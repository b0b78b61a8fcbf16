"""The compiler pipeline: validate, infer, fuse, partition; each a pure pass.

A cluster with GPU workers refuses bfloat16 tensors (`check_devices`): CuPy has no
bfloat16, so a GPU worker could not hold them; the PlanError names the first such node.

`compile_graph` runs the passes in order and returns a `Plan`. With `check=True` the fused
graph is validated and typed again before partitioning (the compiler tests use it). A graph
whose fused softmaxes make a plan that cannot fit is fused again with its softmaxes as nodes
of their own, which the partitioner may split along their axis.
"""

from __future__ import annotations

from deepx_flow.compiler.fuse import fuse_elementwise
from deepx_flow.compiler.infer import infer_types
from deepx_flow.compiler.partition import partition_graph
from deepx_flow.compiler.plan import Plan
from deepx_flow.compiler.validate import validate_graph
from deepx_flow.config import Settings, settings
from deepx_flow.errors import PlanError
from deepx_flow.ir import Graph
from deepx_flow.ir.graph import too_many_nodes
from deepx_flow.ir.program import whole_axes
from deepx_flow.registry.cluster import ClusterSpec


def compile_graph(graph: Graph, cluster: ClusterSpec, config: Settings | None = None,
                  check: bool = False, splits: dict[str, tuple[int, int]] | None = None
                  ) -> Plan:
    """Compile `graph` for `cluster`: validate, infer types, fuse, choose chunk grids.
    `splits` (input id -> (axis, pieces)) places inputs in pieces (`partition_graph`).

    `config` defaults to the settings read from the environment, here and only here, so the
    passes themselves stay pure functions of their arguments.
    """
    config = config or settings()
    if len(graph.nodes) > config.max_nodes:  # e.g. a training graph, twice its model's size
        raise too_many_nodes("the graph", config.max_nodes, len(graph.nodes))
    typed = check_devices(infer_types(validate_graph(graph)), cluster)
    fused = fuse_elementwise(typed)
    if check:
        infer_types(validate_graph(fused))
    try:
        part = partition_graph(fused, cluster, config, splits)
    except PlanError:
        # A softmax fused into its users keeps its axis whole in their inputs' chunks too;
        # unfused, the partitioner may split the operand and assemble rows per task. So a
        # graph that fits unfused is never refused for the fusion.
        if not any(whole_axes(n.attr("program") or n.attr("prologue")) for n in fused.nodes):
            raise
        fused = fuse_elementwise(typed, join_softmax=False)
        part = partition_graph(fused, cluster, config, splits)
    return Plan(typed, fused, part, cluster)


def check_devices(graph: Graph, cluster: ClusterSpec) -> Graph:
    """`graph` unchanged when `cluster`'s workers can hold every dtype it has; a PlanError
    naming the first bfloat16 node when some worker has a GPU (CuPy has no bfloat16, and
    tasks run on whichever worker Dask picks).

    Before: the graph is typed. After: the same graph.
    """
    if not cluster.has_devices:
        return graph
    for node in graph.nodes:
        if node.dtype == "bfloat16":
            gpus = sorted(w.name for w in cluster.workers if w.device)
            raise PlanError(
                f"node {node.id!r} ({node.op}) is bfloat16, which GPU workers cannot hold "
                f"(CuPy has no bfloat16; GPU workers: {', '.join(gpus[:3])}"
                f"{', ...' if len(gpus) > 3 else ''}). Give the data as float32 or float16 "
                "(array.astype('float32')), or run on CPU workers")
    return graph
