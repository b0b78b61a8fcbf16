"""The compiler pipeline: validate, infer, fuse, partition; each a pure pass.

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
from deepx_flow.ir.program import whole_axes
from deepx_flow.registry.cluster import ClusterSpec


def compile_graph(graph: Graph, cluster: ClusterSpec, config: Settings | None = None,
                  check: bool = False) -> Plan:
    """Compile `graph` for `cluster`: validate, infer types, fuse, choose chunk grids.

    `config` defaults to the settings read from the environment, here and only here, so the
    passes themselves stay pure functions of their arguments.
    """
    config = config or settings()
    typed = infer_types(validate_graph(graph))
    fused = fuse_elementwise(typed)
    if check:
        infer_types(validate_graph(fused))
    try:
        part = partition_graph(fused, cluster, config)
    except PlanError:
        # A softmax fused into its users keeps its axis whole in their inputs' chunks too;
        # unfused, the partitioner may split the operand and assemble rows per task. So a
        # graph that fits unfused is never refused for the fusion.
        if not any(whole_axes(n.attr("program") or n.attr("prologue")) for n in fused.nodes):
            raise
        fused = fuse_elementwise(typed, join_softmax=False)
        part = partition_graph(fused, cluster, config)
    return Plan(typed, fused, part, cluster)
