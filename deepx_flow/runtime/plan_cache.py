"""Compiled plans kept for the runs of the same graph: a loop of small runs compiles once.

A training step or a notebook cell runs the same graph again and again on the same cluster;
compiling it each time (validate, infer, fuse, partition) is driver time spent for the same
answer. The passes are pure functions of the graph, the cluster's spec (with the operator
speeds measured on its workers) and the settings, so their result is kept under those (a
bounded LRU of `MAX_PLANS`):

- the graph by the text of its nodes and outputs (`repr`, which tells 1 from 1.0 and True,
  where `==` would not), so any change to a node, an attribute or an output is another plan;
- the spec by equality: workers (threads, memory, what their processes hold, devices),
  links, names;
- the settings (memory fraction, chunk sizes, task limit, ...) by equality.

Not the operator speeds the registry measured (`registry/speeds.py`), though the planner
reads them to keep tasks above `min_task_seconds`: they change after every run (a decayed
average), and a plan made again for new speeds may cut other chunks, and chunks cut
elsewhere round float sums in another order. So a plan chosen for a graph and a cluster is
kept until the cluster changes (its spec: workers, memory, devices, links), a run asks to
plan again (`dx.run(..., replan=True)`, `dx.compile(..., replan=True)`), or MAX_PLANS plans
of other graphs have been made since (it is then planned afresh, with the speeds measured
by then): consecutive runs of a graph on a cluster give identical bits. A plan taken from the cache gets the spec of
this run, so its cost estimates and the recovery's expected task times follow the latest
speeds. A new cluster (another process's, or one restarted) plans with the speeds measured
so far, and may cut other chunks: results agree to their dtype's rounding, not bit for bit.

What a run binds to the plan (input arrays, files, persisted chunks) is not part of a plan:
lowering binds it on every run (`Plan.lower`), so changed data is always read again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.plan import Plan
from deepx_flow.config import Settings, settings
from deepx_flow.ir import Graph
from deepx_flow.registry.cluster import ClusterSpec

MAX_PLANS = 64  # plans of a few graphs in turn (train, eval, ...); each holds no data


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int  # each a compilation
    size: int


_plans: "OrderedDict[tuple, Plan]" = OrderedDict()  # the plan holds the speeds it was made with
_lock = threading.Lock()
_hits = 0
_misses = 0


def graph_token(graph: Graph) -> str:
    """The exact text of a graph: equal only for graphs whose nodes and outputs are written
    the same (the node ids of SDK graphs are content hashes, so this is short work)."""
    return repr((graph.nodes, graph.outputs))


def cached_compile(graph: Graph, cluster: ClusterSpec, config: Settings | None = None,
                   replan: bool = False, splits: dict | None = None) -> Plan:
    """`compile_graph(graph, cluster, config)`, or the plan it gave before for the same
    graph, spec and settings (whatever speeds were measured since), with this `cluster` and
    its operator speeds; with `replan`, compiled again with the speeds measured now, and
    that plan kept instead."""
    global _hits, _misses
    config = config or settings()
    splits = dict(sorted((splits or {}).items()))
    key = (graph_token(graph), cluster, config, tuple(splits.items()))
    with _lock:
        plan = None if replan else _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
            _hits += 1
    if plan is None:
        plan = compile_graph(graph, cluster, config, splits=splits)  # errors are not kept: raised each time
        with _lock:
            _misses += 1
            _plans[key] = plan
            while len(_plans) > MAX_PLANS:
                _plans.popitem(last=False)
        return plan
    if plan.cluster is cluster:
        return plan
    return Plan(plan.graph, plan.fused, plan.partition, cluster)


def cache_info() -> CacheInfo:
    """Hits, misses (compilations) and plans kept, since the process started or `clear`."""
    with _lock:
        return CacheInfo(_hits, _misses, len(_plans))


def clear() -> None:
    """Forget every plan (and the counts)."""
    global _hits, _misses
    with _lock:
        _plans.clear()
        _hits = _misses = 0


__all__ = ["cached_compile", "cache_info", "clear", "graph_token", "CacheInfo", "MAX_PLANS"]
