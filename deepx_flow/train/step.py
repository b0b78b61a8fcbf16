"""The graph of one training step: forward, backward (the `differentiate` pass) and update.

Its inputs are placeholders: the parameters, the optimizer's state, the step's scalars (the
scheduled learning rate, bias corrections) and one batch of each data column. Its outputs are
the new parameters and state, the loss and the gradients' global norm. Every step runs this
one graph, so it is compiled once; a run binds each step's placeholders to the previous
step's outputs and to its batch (`train.loop`).
"""

from __future__ import annotations

from dataclasses import dataclass

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import Graph, dtypes
from deepx_flow.sdk.build import build_graph
from deepx_flow.sdk.functions import input as placeholder
from deepx_flow.sdk.grad import grad
from deepx_flow.sdk.tensor import Tensor


@dataclass(frozen=True)
class StepGraph:
    """The step's graph and the names of its placeholders and outputs.

    `params`, `state` and `scalars` map the user's names (parameter `0.weight`, state
    `m/0.weight`, scalar `lr`) to the graph's input names; the outputs of new values are
    named like their inputs with a `new_` prefix.
    """

    graph: Graph
    params: dict[str, str]
    state: dict[str, str]
    scalars: dict[str, str]
    batch: tuple[str, ...]
    metrics: tuple[str, ...] = ()  # the loss function's own metrics, by name


def build_step(loss_fn, shapes: dict[str, tuple[tuple[int, ...], str]], optimizer,
               batch: list[tuple[tuple[int, ...], str]]) -> StepGraph:
    """Trace `loss_fn(params, *batch)` on placeholders and add its gradients and update.

    Parameters
    ----------
    loss_fn : callable
        `loss_fn(params: dict of Tensor, *columns: Tensor) -> scalar Tensor`.
    shapes : dict
        Parameter name -> (shape, dtype).
    optimizer : dx.optim.Optimizer
    batch : list
        (shape, dtype) of one batch of each data column.
    """
    params = {name: placeholder(f"param_{i}", shape, dtype)
              for i, (name, (shape, dtype)) in enumerate(shapes.items())}
    columns = [placeholder(f"batch_{i}", shape, dtype) for i, (shape, dtype) in enumerate(batch)]
    loss, metrics = loss_and_metrics(loss_fn(dict(params), *columns))
    grads = dict(zip(params, grad(loss, list(params.values()))))
    state0 = optimizer.init(params)
    state_in = {slot: {name: placeholder(f"state_{slot}_{i}", t.shape, t.dtype)
                       for i, (name, t) in enumerate(values.items())}
                for slot, values in state0.items()}
    scalars_in = {k: placeholder(f"scalar_{k}", (), "float64") for k in optimizer.scalars(1)}
    update = optimizer.update(params, grads, state_in, scalars_in)
    outputs = {"loss": loss, "grad_norm": update.grad_norm,
               **{"metric_" + name: t for name, t in metrics.items()}}
    for name, t in update.params.items():
        outputs["new_" + params[name].node.id] = t
    for slot, values in update.state.items():
        for name, t in values.items():
            outputs["new_" + state_in[slot][name].node.id] = t
    graph = build_graph(outputs)
    unknown = {n.id for n in graph.inputs} - {t.node.id for t in params.values()} - \
        {t.node.id for t in columns} - {t.node.id for t in scalars_in.values()} - \
        {t.node.id for v in state_in.values() for t in v.values()}
    if unknown:
        raise GraphError(f"the loss function reads inputs the training loop cannot give: "
                         f"{', '.join(map(shown, sorted(unknown)))}; pass data as columns of "
                         "`data` and parameters in `params`")
    return StepGraph(graph,
                     {name: t.node.id for name, t in params.items()},
                     {f"{slot}/{name}": t.node.id for slot, v in state_in.items()
                      for name, t in v.items()},
                     {k: t.node.id for k, t in scalars_in.items()},
                     tuple(t.node.id for t in columns), tuple(metrics))


# What the loop records under its own names, which a loss function's metric may not take.
RESERVED_METRICS = ("loss", "grad_norm", "lr", "samples_per_second", "step", "epoch", "seconds")


def loss_and_metrics(result) -> tuple[Tensor, dict[str, Tensor]]:
    """What a loss function returned: a scalar loss, or `(loss, {name: scalar metric})`."""
    loss, metrics = result if isinstance(result, tuple) and len(result) == 2 else (result, {})
    if not isinstance(loss, Tensor):
        raise GraphError(f"the loss function returned a {type(loss).__name__}, not a dx.Tensor "
                         "(or a (loss, metrics) pair)")
    if loss.shape != () or not dtypes.is_float(loss.dtype):
        raise GraphError(f"the loss function must return a floating-point scalar, got "
                         f"{loss.dtype}{loss.shape} (mean or sum it)", loss.node.id)
    if not isinstance(metrics, dict):
        raise GraphError(f"the loss function's metrics must be a dict of named scalars, got "
                         f"{shown(metrics)}")
    for name, t in metrics.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise GraphError(f"metric names are identifiers, got {shown(name)}")
        if name in RESERVED_METRICS:
            raise GraphError(f"a metric may not be named {shown(name)}: the training loop "
                             f"records {', '.join(RESERVED_METRICS)} itself")
        if not isinstance(t, Tensor) or t.shape != () or t.dtype == "bool":
            raise GraphError(f"metric {shown(name)} must be a numeric scalar tensor, got "
                             f"{shown(t)}")
    return loss, {name: metrics[name] for name in sorted(metrics)}


def takes_step(loss_fn) -> bool:
    """Whether the loss takes the step (`step=`, for dropout): then each training step is
    traced with its number, and evaluations with `step=None` (no dropout)."""
    import inspect
    try:
        return "step" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False
