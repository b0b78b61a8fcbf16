"""One clear error for a task that failed: which operator, which chunk, and why.

Dask reports a failed task by its key, and a task that killed its workers as a bare
`KilledWorker`. `task_failure` turns either into an ExecutionError that names the node, its
operator and the chunk, says what the failure means, and carries its kind ("oom",
"device-lost", "killed-worker", "timeout", "no-workers", "codegen" or None) for the code that
decides whether to plan the run again: only "oom", data that did not fit, is planned again.
"""

from __future__ import annotations

from deepx_flow.errors import DataError, DeepxError, ExecutionError
from deepx_flow.ir.keys import key_name, node_of
from deepx_flow.kernels.attempt import classify


def describe_task(plan, key) -> str:
    """'operator matmul+epilogue[relu(in0)] (node matmul_2), chunk (0, 1)' for a key of
    `plan`'s graph; the key itself for one that is not."""
    from deepx_flow.ir.program import operator_label
    node_id, rest = node_of(key), key_name(key).partition("@")[2]
    nodes = {n.id: n for n in plan.fused.nodes} if plan is not None else {}
    if node_id not in nodes:
        return f"task {key}"
    step = rest.partition(".")[2]
    chunk = tuple(key[1:]) if isinstance(key, tuple) else ()
    where = f"chunk {chunk}" if chunk else "its only chunk"
    return (f"operator {operator_label(nodes[node_id])} (node {node_id}), {where}"
            + (f" ({step} step)" if step else ""))


def failure_kind(err: BaseException) -> str | None:
    from deepx_flow.runtime.supervisor import NoWorkers, TaskTimedOut
    name = type(err).__name__
    if name == "KilledWorker":
        return "killed-worker"
    if isinstance(err, TaskTimedOut):
        return "timeout"
    if isinstance(err, NoWorkers):
        return "no-workers"
    return classify(err)


HINTS = {
    "killed-worker": "its worker process died each time it ran it (out of host memory, or "
                     "a crash in a kernel); Dask stopped trying",
    "oom": "it ran out of memory",
    "device-lost": "the GPU it ran on failed",
    "timeout": "it ran past its time limit on every worker that tried it (see "
               "dx.Recovery: timeout)",
    "no-workers": "the cluster had no workers left",
    "codegen": "its fused kernel could not be generated or compiled; this is not the data "
               "running out of memory, and smaller chunks would not help",
}


def task_failure(plan, key, err: BaseException) -> DeepxError:
    """The ExecutionError for `key` failing with `err`; its `.kind` says what happened. A
    task that found its input data missing or damaged raises that DataError itself: it
    already names the data, and the data, not the run, is what needs mending."""
    if isinstance(err, DataError):
        return err
    kind = failure_kind(err)
    hint = f" ({HINTS[kind]})" if kind in HINTS else ""
    where = describe_task(plan, key)
    inner = getattr(err, "deepx_chunk", None)  # a chunk computed inside the task failed
    if inner is not None:
        where = f"{describe_task(plan, inner)}, computed inside {where},"
    out = ExecutionError(f"{where} failed{hint}: {type(err).__name__}: {err}")
    out.kind = kind
    return out
