"""Held-out evaluation during training: the loss (and the loss function's metrics) of the
latest parameters on `eval_data`, a graph compiled once and run on the parameters' chunks
where they are."""

from __future__ import annotations

from dask.base import tokenize

from deepx_flow.config import settings
from deepx_flow.runtime.inputs import ArraySource
from deepx_flow.train.data import dataset_of
from deepx_flow.train.step import takes_step


def evaluator(loss_fn, values, eval_data, client, spec, db=None):
    """A function of the current parameter sources giving the held-out loss."""
    from deepx_flow.runtime.plan_cache import cached_compile
    from deepx_flow.sdk.build import build_graph
    from deepx_flow.sdk.functions import input as placeholder
    columns = dataset_of(eval_data).columns
    if any(c.array is None for c in columns):
        from deepx_flow.sdk.functions import read_zarr
        tensors = [read_zarr(c.uri) if c.array is None else None for c in columns]
    else:
        tensors = [None] * len(columns)
    inputs = {}
    for i, (c, t) in enumerate(zip(columns, tensors)):
        if t is None:
            tensors[i] = placeholder(f"eval_{i}", c.shape, c.dtype)
            inputs[tensors[i].node.id] = c.array
    params = {name: placeholder(f"param_{i}", v.shape, v.dtype.name)
              for i, (name, v) in enumerate(values.items())}
    from deepx_flow.train.step import loss_and_metrics
    loss, metrics = loss_and_metrics(loss_fn(params, *tensors, step=None)
                                     if takes_step(loss_fn) else loss_fn(params, *tensors))
    graph = build_graph({"loss": loss, **metrics})
    plan = cached_compile(graph, spec, settings())
    fixed = {k: ArraySource(v, tokenize(v)) for k, v in inputs.items()}

    def evaluate(current) -> dict[str, float]:
        """The held-out loss and metrics of the parameters `current` (sources)."""
        from deepx_flow.runtime.run import _compute
        sources = {**fixed, **{params[name].node.id: src for name, src in current.items()
                               if params[name].node.id in {n.id for n in graph.inputs}}}
        # Ended by the call, as a `dx.run` is: succeeded, or failed with its error.
        values = _compute(plan, graph, sources, client, False, kind="evaluate", db=db)
        return {name: float(value) for name, value in values.items()}
    return evaluate
