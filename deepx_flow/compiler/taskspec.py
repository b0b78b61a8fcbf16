"""The one place that builds Dask task objects.

Dask's task classes (`dask._task_spec`) are what dask.array itself now emits. Keeping every
use here means a change in them is mended in one file.
"""

from __future__ import annotations

from dask._task_spec import DataNode, Task, TaskRef

from deepx_flow.kernels.attempt import attempt, inlined


def task(key, func, *args):
    """A task calling `func(*args)`; TaskRefs among the top-level args are resolved.

    It runs through `kernels.attempt` (retry backoff, fault injection, failure reports)."""
    return Task(key, attempt, func, *args)


def inline_task(key, func, *args):
    """A call that another task makes as it runs (Dask computes nested tasks first and passes
    their results as arguments): `func(*args)` through `kernels.attempt.inlined`, computing
    the chunk `key`."""
    return Task(None, inlined, key, func, *args)


def refs_of(node) -> list:
    """The keys a task (or inline call) reads, once per reference, its nested calls' included."""
    found = []
    for arg in node.args:
        if isinstance(arg, TaskRef):
            found.append(arg.key)
        elif isinstance(arg, Task):
            found += refs_of(arg)
    return found


def inlined_chunks(node) -> list:
    """The chunk keys computed by inline calls inside a task, nested ones included."""
    found = []
    for arg in node.args:
        if isinstance(arg, Task):
            if arg.func is inlined:
                found.append(arg.args[0])
            found += inlined_chunks(arg)
    return found


def substitute(node, calls: dict):
    """`node` with every top-level reference to a key of `calls` replaced by that inline call
    (nested calls already built by `substitute` are kept as they are)."""
    if not any(isinstance(a, TaskRef) and a.key in calls for a in node.args):
        return node
    args = [calls[a.key] if isinstance(a, TaskRef) and a.key in calls else a for a in node.args]
    return Task(node.key, node.func, *args)


def ref(key) -> TaskRef:
    return TaskRef(key)


def data_node(key, value) -> DataNode:
    """A task whose result is `value`, held in the graph itself (so it can be re-run)."""
    return DataNode(key, value)


def dependency_order(graph: dict) -> list:
    """The keys of a dask graph, each after the keys it reads (iteratively: dask graphs can
    be deep chains)."""
    order, done = [], set()
    for root in graph:
        stack = [(root, False)]
        while stack:
            key, expanded = stack.pop()
            if key in done:
                continue
            if expanded:
                done.add(key)
                order.append(key)
                continue
            stack.append((key, True))
            stack.extend((d, False) for d in graph[key].dependencies
                         if d in graph and d not in done)
    return order
