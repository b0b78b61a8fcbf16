"""The one place that builds Dask task objects.

Dask's task classes (`dask._task_spec`) are what dask.array itself now emits. Keeping every
use here means a change in them is mended in one file.
"""

from __future__ import annotations

from dask._task_spec import DataNode, Task, TaskRef

from deepx_flow.kernels.attempt import attempt


def task(key, func, *args):
    """A task calling `func(*args)`; TaskRefs among the top-level args are resolved.

    It runs through `kernels.attempt` (retry backoff, fault injection, failure reports)."""
    return Task(key, attempt, func, *args)


def ref(key) -> TaskRef:
    return TaskRef(key)


def data_node(key, value) -> DataNode:
    """A task whose result is `value`, held in the graph itself (so it can be re-run)."""
    return DataNode(key, value)
