"""`dx.compile`, `dx.run` and `dx.persist`: tensors (or a graph) to plans, arrays and
persisted outputs.

These collect the graph behind the tensors (`build.py`) and the data they carry
(`bindings.py`), hand both to the runtime (`runtime/run.py`, which takes a graph and its
inputs and knows nothing of tensors) and give the results back in the form the outputs
were asked in: one tensor gives one array, a list a list, a dict (or a Graph) a dict by
name.
"""

from __future__ import annotations

from deepx_flow.compiler.plan import Plan
from deepx_flow.ir import Graph
from deepx_flow.runtime.cancel import Cancellation
from deepx_flow.runtime.progress import RunProgress
from deepx_flow.runtime.recovery import Recovery
from deepx_flow.runtime.run import (Persisted, checked as checked_graph, compile_graph,
                                    persist_graph, run_graph)
from deepx_flow.sdk.bindings import with_bound_inputs
from deepx_flow.sdk.build import build_graph
from deepx_flow.sdk.tensor import Tensor


def compile(outputs, cluster=None, client=None, replan: bool = False) -> Plan:  # noqa: A001
    """Compile tensors (or a Graph) into a chunked plan for a cluster.

    Parameters
    ----------
    outputs : Tensor, list or dict of Tensors, or Graph
        What to compute.
    cluster : ClusterSpec or path, optional
        Plan for this cluster (a `graphs/clusters/*.yaml` file) instead of the one in use.
    client : distributed.Client, optional
        Plan for this client's cluster.
    replan : bool, optional
        Plan again with the operator speeds measured now, and keep that plan for the
        graph's next runs on this cluster (by default the plan chosen before is kept:
        `runtime/plan_cache.py`).

    Returns
    -------
    Plan
        `plan.explain()` prints chunk grids, task costs and the compute/communication ratio.
    """
    return compile_graph(build_graph(outputs), cluster, client, replan)


def run(outputs, inputs: dict | None = None, client=None, scheduler: str | None = None,
        cluster=None, progress: bool | RunProgress | None = None,
        recovery: Recovery | None = None, replan: bool = False,
        cancel: Cancellation | None = None):
    """Compute `outputs` and return them as NumPy arrays.

    Parameters
    ----------
    outputs : Tensor, list or dict of Tensors, or Graph
        A single tensor gives one array, a list a list, a dict (or Graph) a dict by name.
    inputs : dict, optional
        Input name -> NumPy array, `.npy` path, Zarr path/URL, or a `Persisted` output of an
        earlier `dx.persist` (the run then uses the cluster that holds it). Data the tensors
        carry (`dx.from_dask` arrays, NumPy operands) is bound without being named here.
    client : distributed.Client, optional
        Run on this client's cluster. Without it (and without `scheduler`), the Dask client
        this process already made is used, or else this process's embedded local cluster,
        started on first use and kept until exit (or `dx.shutdown()`).
    scheduler : str, optional
        Address of a running Dask scheduler (e.g. one with `dask cuda worker` processes).
    cluster : ClusterSpec or path, optional
        Plan with this cluster description instead of the one found at run time.
    progress : bool, optional
        Show the run's id, its dashboard link and a progress bar (tasks done, bytes
        computed, time elapsed and left) once it has run for 2 s. By default when the
        session is interactive (a terminal, IPython or a notebook).
    recovery : dx.Recovery, optional
        Retries, backups of slow tasks, timeouts and drift, and re-planning after running
        out of memory (see docs/recovery.md); by default no retries, no timeout, and a task
        running past 4 times its expected time (at least 1 s) gets a backup elsewhere.
    replan : bool, optional
        Plan again with the operator speeds measured now (see `dx.compile`); by default a
        graph run again on the same cluster keeps its plan, and gives the same bits.
    cancel : dx.Cancellation, optional
        A token whose `cancel()`, from another thread, stops the run: it raises
        `RunCancelled` and is recorded interrupted.
    """
    graph = build_graph(outputs)
    results = run_graph(graph, with_bound_inputs(outputs, inputs), client, scheduler, cluster,
                        progress, recovery, replan, cancel)
    return _shaped(outputs, graph, results)


def persist(outputs, inputs: dict | None = None, client=None, scheduler: str | None = None,
            cluster=None, recovery: Recovery | None = None, replan: bool = False):
    """Compute `outputs` and keep them on the cluster; returns `Persisted` handles, in the
    form `run` gives arrays.

    Use this for outputs too large to gather. Without a client, the process's embedded
    cluster is used, as by `run` (whose other parameters these are).
    """
    graph = build_graph(outputs)
    handles = persist_graph(graph, with_bound_inputs(outputs, inputs), client, scheduler,
                            cluster, recovery, replan)
    return _shaped(outputs, graph, handles)


def checked(outputs, inputs: dict | None = None) -> tuple[Graph, dict]:
    """The graph of `outputs`, validated and typed, and its bound inputs, the data the
    tensors carry among them: every mistake is reported before a cluster is contacted."""
    return checked_graph(build_graph(outputs), with_bound_inputs(outputs, inputs))


def _shaped(outputs, graph: Graph, by_name: dict):
    """Results by output name in the form the outputs were asked in."""
    if isinstance(outputs, Tensor):
        return by_name[graph.outputs[0][0]]
    if isinstance(outputs, (dict, Graph)):
        return by_name
    return [by_name[name] for name, _ in graph.outputs]


__all__ = ["compile", "run", "persist", "checked", "Persisted"]
