"""Pass: choose where each trained parameter and its optimizer state live.

Before: a training step's graph (`train.step`), its parameters' and state's placeholders,
and a `ClusterSpec`. After: a `ParameterPlacement`: for each parameter a strategy
(`replicated.py`, `sharded.py`, `tensor_parallel.py`), the bytes each worker keeps and sends
per step, and the step's predicted compute and communication.

How it chooses: each parameter first takes the strategy whose collectives take least time on
the cluster's measured links (`collectives.py`). While the workers would keep more than
their share of memory for parameters (`PARAMETER_SHARE` of the smallest worker's at most,
and less the step's own values where the caller reserves them; the rest is for the step's
tasks), the parameter whose change to a strategy needing fewer bytes (kept and gathered)
costs the fewest seconds per byte saved is changed (of changes costing the same per byte,
the one saving the most). When every parameter is at its fewest bytes and they still do not
fit, a PlanError says by how much. The loss function is the same whichever is chosen: the
strategies change where tensors live and what moves, not what is computed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from deepx_flow.compiler.partition import joined_axes
from deepx_flow.compiler.placing.collectives import Collectives
from deepx_flow.compiler.placing.params import TrainedParameter, trained_parameters
from deepx_flow.compiler.placing.replicated import Replicated
from deepx_flow.compiler.placing.sharded import Sharded
from deepx_flow.compiler.placing.strategy import Strategy
from deepx_flow.compiler.placing.tensor_parallel import TensorParallel
from deepx_flow.config import Settings, settings
from deepx_flow.errors import PlanError
from deepx_flow.ir import Graph
from deepx_flow.registry.cluster import ClusterSpec, format_bytes
from deepx_flow.text_table import text_table

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (Replicated(), Sharded(),
                                                      TensorParallel())}
# At most this share of a worker's memory keeps parameters, gradients and optimizer state;
# the step's tasks plan with what is left.
PARAMETER_SHARE = 0.8


@dataclass(frozen=True)
class Placed:
    """One parameter's placement: its strategy and what it costs each worker."""

    parameter: TrainedParameter
    strategy: str
    axis: int | None   # the axis it is split along; None when whole
    kept: int          # bytes of it, its gradient and state a worker keeps
    gathered: int      # bytes a worker holds for a moment while a step uses it
    sent: int          # bytes a worker sends per step for its collectives
    seconds: float     # the step's time in its collectives


@dataclass(frozen=True)
class ParameterPlacement:
    cluster: str
    workers: int
    placed: tuple[Placed, ...]
    limit: int               # bytes per worker for parameters, gradients and state
    flops: float             # the step's arithmetic, all workers together
    compute_seconds: float   # that arithmetic on the cluster's compute rate

    def __getitem__(self, name: str) -> Placed:
        for p in self.placed:
            if p.parameter.name == name:
                return p
        raise KeyError(name)

    @property
    def kept(self) -> int:
        """Bytes the busiest worker holds: what it keeps, and the largest gathered copy."""
        return sum(p.kept for p in self.placed) + max((p.gathered for p in self.placed),
                                                      default=0)

    @property
    def communication_seconds(self) -> float:
        return sum(p.seconds for p in self.placed)

    @property
    def step_seconds(self) -> float:
        """Predicted, communication not overlapped with compute."""
        return self.compute_seconds + self.communication_seconds

    @property
    def ratio(self) -> float:
        """Compute over communication (the design asks for above 10)."""
        comm = self.communication_seconds
        return float("inf") if comm == 0 else self.compute_seconds / comm

    def strategies(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.placed:
            out[p.strategy] = out.get(p.strategy, 0) + 1
        return out

    def explain(self) -> str:
        rows = [(p.parameter.name, "x".join(map(str, p.parameter.shape)) or "()",
                 p.strategy + ("" if p.axis is None else f" (axis {p.axis})"),
                 format_bytes(p.kept), format_bytes(p.sent), f"{p.seconds * 1e3:.3g} ms")
                for p in self.placed]
        table = text_table(("parameter", "shape", "placement", "kept per worker",
                            "sent per step", "communication"), rows,
                           f"parameters on {self.cluster} ({self.workers} workers)")
        chosen = ", ".join(f"{n} {k}" for k, n in sorted(self.strategies().items()))
        ratio = "inf" if self.ratio == float("inf") else f"{self.ratio:.3g}"
        return (f"{table}\nchosen: {chosen}\nkept per worker: {format_bytes(self.kept)} of "
                f"{format_bytes(self.limit)} for parameters and state\nstep: compute "
                f"{self.compute_seconds * 1e3:.4g} ms ({self.flops:.3g} FLOPs), "
                f"communication {self.communication_seconds * 1e3:.4g} ms, predicted "
                f"{self.step_seconds * 1e3:.4g} ms; compute/communication {ratio}")


def place_parameters(graph: Graph, params: dict[str, str], state: dict[str, str],
                     cluster: ClusterSpec, config: Settings | None = None,
                     strategy: str = "auto", limit: int | None = None
                     ) -> ParameterPlacement:
    """Place the parameters of a step graph (see the module docstring).

    `params` maps the user's parameter names to their placeholders, `state` "slot/name" to
    the optimizer state's. `strategy` "auto" chooses; a strategy's name places every
    parameter it applies to that way (the others replicated), still within memory.
    `limit`: the bytes a worker keeps parameters in (default `PARAMETER_SHARE` of the
    smallest worker's memory).
    """
    config = config or settings()
    if strategy != "auto" and strategy not in STRATEGIES:
        raise PlanError(f"unknown placement {strategy!r}: auto or "
                        f"{', '.join(STRATEGIES)}")
    ring = Collectives.of(cluster)
    n = ring.workers
    trained = trained_parameters(graph, params, state)
    budget = min(w.budget for w in cluster.workers)
    limit = int(budget * PARAMETER_SHARE) if limit is None else \
        max(0, min(int(budget * PARAMETER_SHARE), limit))

    def placed(p: TrainedParameter, s: Strategy) -> Placed:
        moves = s.collectives(p, n)
        return Placed(p, s.name, s.axis(p, n), int(s.kept(p, n)), int(s.gathered(p, n)),
                      int(sum(ring.sent(kind, b) for kind, b in moves)),
                      sum(ring.seconds(kind, b) for kind, b in moves))

    # A strategy that splits the arithmetic along an axis some operator keeps whole
    # (softmax's, a reshape's trailing axes) does not apply.
    classes = joined_axes(graph, config, 2**62).classes
    options = {p.name: [placed(p, s) for s in STRATEGIES.values() if s.applies(p, n) and (
                   not s.splits_arithmetic or not classes.whole_reason((p.node, s.axis(p, n))))]
               for p in trained}
    if strategy == "auto":
        chosen = {name: min(opts, key=lambda o: o.seconds) for name, opts in options.items()}
    else:
        chosen = {name: next((o for o in opts if o.strategy == strategy), opts[0])
                  for name, opts in options.items()}
        options = {name: [chosen[name]] for name in options}  # as asked: not changed
    while _kept(chosen) > limit:
        changes = []
        for name, opts in options.items():
            for o in opts:
                # (bytes the parameter itself needs, kept and gathered: a change that saves
                # none of the total, as another parameter gathers as much, still progresses)
                saved = _own(chosen[name]) - _own(o)
                if saved > 0:
                    changes.append(((o.seconds - chosen[name].seconds) / saved, saved, name, o))
        if not changes:
            raise PlanError(_cannot_fit(chosen, limit, cluster, strategy))
        # Collectives cost about the same per byte for every tensor of one dtype, so many
        # changes tie: among those within rounding of the cheapest, the one saving the most
        # bytes (a layer's weight before its bias: fewer tensors gathered for the same room).
        cheapest = min(c[0] for c in changes)
        tied = [c for c in changes if c[0] <= cheapest + abs(cheapest) * 1e-6 + 1e-18]
        _, _, name, o = max(tied, key=lambda c: c[1])
        chosen[name] = o
    flops = step_flops(graph, config)
    rate = sum(w.compute_rate for w in cluster.workers)
    placed_in_order = _paired(tuple(chosen[p.name] for p in trained), classes)
    return ParameterPlacement(cluster.name, n, placed_in_order, limit, flops, flops / rate)


def _paired(placed: tuple[Placed, ...], classes) -> tuple[Placed, ...]:
    """Tensor-parallel weights paired as Megatron pairs them: a square weight whose input
    axis is chunked alike with the output axis another tensor-parallel weight splits (the
    next layer's K, the columns of the layer before) is split along it too (rows, partial
    products summed), so each weight is cut in n pieces, not n x n tiles; in the order of
    the parameters. The others split their output axis (columns). (A weight of another
    shape keeps its columns: its bytes kept would differ from what was chosen.)"""
    split_roots, out = set(), []
    for p in placed:
        node = p.parameter.node
        if p.strategy == "tensor_parallel" and p.parameter.shape[0] == p.parameter.shape[1] \
                and classes.find((node, 0)) in split_roots \
                and not classes.whole_reason((node, 0)):
            # (a square weight: it keeps and gathers as many bytes either way)
            p = replace(p, axis=0)
        if p.axis is not None and STRATEGIES[p.strategy].splits_arithmetic:
            split_roots.add(classes.find((node, p.axis)))
        out.append(p)
    return tuple(out)


def _own(p: Placed) -> int:
    return p.kept + p.gathered


def _kept(chosen: dict[str, Placed]) -> int:
    return sum(p.kept for p in chosen.values()) + max(
        (p.gathered for p in chosen.values()), default=0)


def _cannot_fit(chosen: dict[str, Placed], limit: int, cluster: ClusterSpec,
                strategy: str) -> str:
    largest = max(chosen.values(), key=lambda p: p.kept)
    how = "however they are placed" if strategy == "auto" else f"placed {strategy}"
    return (f"the parameters, gradients and optimizer state need "
            f"{format_bytes(_kept(chosen))} per worker {how}, more than the "
            f"{format_bytes(limit)} a worker of cluster '{cluster.name}' keeps them in (at "
            f"most {PARAMETER_SHARE:.0%} of its memory, less what the step needs beside); "
            f"the largest is "
            f"'{largest.parameter.name}' {largest.parameter.shape} "
            f"({format_bytes(largest.parameter.nbytes)}). Use more workers or workers with "
            f"more memory")


def step_flops(graph: Graph, config: Settings) -> float:
    """The step's arithmetic, every node computed whole once (the chunking rules' costs)."""
    s = joined_axes(graph, config, 2**62)
    return float(sum(s.rules[n.id].cost(n, s.inputs(n), s).flops for n in graph.nodes))
