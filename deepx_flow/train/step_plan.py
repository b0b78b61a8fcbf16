"""A training step planned for a cluster, without running it: `dx.train(..., plan_only=True,
cluster=FILE)` and `deepx-flow explain` of a saved step spec.

The step graph (`train.step`) is placed (`compiler/placing`: where each parameter and its
optimizer state live, what each worker keeps and sends) and then compiled with the memory
the parameters leave each worker for the step's tasks. So a plan for a cluster we do not
have says the strategy chosen, the memory per worker (kept, and the tasks' working sets
within what is left), the predicted step time and its compute/communication ratio.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from deepx_flow.compiler.compile import compile_graph
from deepx_flow.compiler.fuse import fuse_elementwise
from deepx_flow.compiler.placing.gather import gathered_where_used, update_and_gradients
from deepx_flow.compiler.infer import infer_types
from deepx_flow.compiler.placing import ParameterPlacement, place_parameters
from deepx_flow.compiler.plan import Plan
from deepx_flow.compiler.validate import validate_graph
from deepx_flow.config import Settings, settings
from deepx_flow.errors import GraphError, PlanError, shown
from deepx_flow.ir import Graph, dtypes
from deepx_flow.registry.cluster import ClusterSpec, format_bytes


@dataclass(frozen=True)
class StepPlan:
    """A step's parameter placement and its compiled plan."""

    placement: ParameterPlacement
    plan: Plan
    # Bytes of the step's intermediate values a worker holds at the step's peak: the most
    # alive at once (made and not yet read for the last time, in the order the graph
    # computes them; the forward pass's values wait for the backward), the batch spread
    # over the workers (`peak_live_bytes`).
    activations: int
    state: dict[str, str] = field(default_factory=dict)  # "slot/name" -> its placeholder

    @property
    def splits(self) -> dict[str, tuple[int, int]]:
        """Input id -> (axis, pieces) of each parameter placed in pieces and of its state:
        how the plan was compiled, and where a run keeps them (piece i on worker i)."""
        return placed_splits(self.placement, self.state)

    @property
    def gathered(self) -> set[str]:
        """The inputs the step gathers where it uses them (`placing/gather.py`)."""
        return gathered_inputs(self.placement, self.state)

    @property
    def task_memory(self) -> int:
        """Bytes the step's tasks hold on a worker at once, at most: its threads each
        running the step's largest task (within the budget the parameters leave)."""
        largest = max((n.peak_working_set for n in self.plan.stats().nodes), default=0)
        return max(w.tasks_at_once for w in self.plan.cluster.workers) * largest

    @property
    def memory_per_worker(self) -> int:
        """The most a worker holds: the parameters it keeps and gathers, its share of the
        step's live values, and its running tasks."""
        return self.placement.kept + self.activations + self.task_memory

    def to_yaml(self, path=None) -> str:
        """The step's graph as a spec (`deepx-flow explain` plans it again, for any
        cluster file)."""
        from deepx_flow.spec.yaml_io import to_yaml
        return to_yaml(self.plan.graph, path, name="training step")

    def explain(self) -> str:
        limit = min(w.budget for w in self.plan.cluster.workers)
        return "\n".join([
            self.placement.explain(), "",
            f"memory per worker: {format_bytes(self.memory_per_worker)} of "
            f"{format_bytes(limit)} (parameters and state {format_bytes(self.placement.kept)},"
            f" live values {format_bytes(self.activations)}, running tasks "
            f"{format_bytes(self.task_memory)}; a task may use "
            f"{format_bytes(self.plan.partition.budget)})", "", self.plan.explain()])

    def __repr__(self) -> str:
        p = self.placement
        return (f"<StepPlan on '{p.cluster}': {p.strategies()}, "
                f"{format_bytes(self.memory_per_worker)} per worker, predicted step "
                f"{p.step_seconds * 1e3:.4g} ms>")


def plan_step(graph: Graph, params: dict[str, str], state: dict[str, str],
              cluster: ClusterSpec, config: Settings | None = None,
              placement: str = "auto") -> StepPlan:
    """Place the step's parameters and compile the step with the memory they leave.

    The step's own live values come first; the parameters are placed in a share of what
    they leave (`SHARES`, the largest first), and the step is compiled with what is left
    after both, for its tasks. A share whose tasks cannot fit is followed by a smaller one;
    when none fits, the PlanError says what each part needs."""
    config = config or settings()
    workers = len(cluster.workers)
    # One batch chunk per worker thread, as `dx.train` compiles its step; and the task limit
    # per worker, as `dx.train` groups each shard's tasks into one (`compiler/group.py`).
    step_config = replace(config, chunks_per_thread=1, max_tasks=config.max_tasks * workers)
    fused = fuse_elementwise(infer_types(validate_graph(graph)))
    # The parameters, their state, gradients, update and new values (which take their
    # place) are what the placement keeps or holds for a moment, not the step's own live
    # values.
    kept = set(params.values()) | set(state.values())
    kept |= update_and_gradients(fused, kept)
    live = peak_live_bytes(fused, kept) // workers
    budget = min(w.budget for w in cluster.workers)
    if live >= budget:
        raise PlanError(
            f"the training step's live values alone need {format_bytes(live)} per worker "
            f"(its intermediate values alive at once, the batch spread over {workers} "
            f"workers), more than the {format_bytes(budget)} of cluster '{cluster.name}'. Use "
            f"a smaller batch, shorter sequences or more workers")
    failed = None
    for share in SHARES:
        placed = place_parameters(graph, params, state, cluster, config, placement,
                                  limit=int((budget - live) * share))
        try:
            plan = compile_graph(
                gathered_where_used(graph, gathered_inputs(placed, state)),
                less_memory(cluster, placed.kept + live), step_config,
                splits=placed_splits(placed, state))
        except PlanError as err:
            failed = err
            continue
        return StepPlan(placed, replace(plan, cluster=cluster), live, dict(state))
    chosen = ", ".join(f"{n} {k}" for k, n in sorted(placed.strategies().items()))
    raise PlanError(
        f"the training step does not fit cluster '{cluster.name}' ({format_bytes(budget)} "
        f"per worker): its live values need {format_bytes(live)} per worker, and with the "
        f"parameters and state in {format_bytes(placed.kept)} ({chosen}) its tasks do not "
        f"fit in what is left: {failed}") from None


def placed_splits(placement: ParameterPlacement, state: dict[str, str]
                  ) -> dict[str, tuple[int, int]]:
    """Input id -> (axis, workers) of each parameter the placement splits, and of its
    optimizer state (`state`: "slot/name" -> placeholder), which is updated beside it."""
    out = {}
    for p in placement.placed:
        if p.axis is not None:
            for node_id in _with_state(p.parameter, state):
                out[node_id] = (p.axis, placement.workers)
    return out


def gathered_inputs(placement: ParameterPlacement, state: dict[str, str]) -> set[str]:
    """The parameters placed sharded and their state: the step gathers them where it uses
    them (`placing/gather.py`)."""
    return {node_id for p in placement.placed if p.strategy == "sharded"
            for node_id in _with_state(p.parameter, state)}


def _with_state(p, state: dict[str, str]) -> list[str]:
    return [p.node] + [node_id for key, node_id in state.items()
                       if key.split("/", 1)[1] == p.name]


SHARES = (0.8, 0.6, 0.4, 0.2)  # of what the live values leave, tried for the parameters


def less_memory(cluster: ClusterSpec, kept: int) -> ClusterSpec:
    """`cluster` with `kept` bytes of every worker's memory taken (by the parameters)."""
    workers = []
    for w in cluster.workers:
        if w.device is not None:
            device = replace(w.device, usable=max(0, w.device.budget - kept))
            workers.append(replace(w, device=device))
        else:
            workers.append(replace(w, reserved=w.reserved + kept))
    return replace(cluster, workers=tuple(workers))


def peak_live_bytes(graph: Graph, skip=()) -> int:
    """The most bytes of node results alive at once when `graph` is computed in its node
    order, each result alive from its node to its last reader (an output to the end);
    the nodes in `skip` (kept elsewhere) not counted."""
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for src in node.inputs:
            last[src] = i
    for node_id in graph.output_ids:
        last[node_id] = len(graph.nodes)
    ends: dict[int, int] = {}
    live = peak = 0
    for i, node in enumerate(graph.nodes):
        if node.id not in skip and node.id in last:
            size = math.prod(node.shape) * dtypes.itemsize(node.dtype)
            live += size
            peak = max(peak, live)
            ends[last[node.id]] = ends.get(last[node.id], 0) + size
        live -= ends.pop(i, 0)
    return peak


_PARAM = re.compile(r"param_(\d+)")
_STATE = re.compile(r"state_(.+)_(\d+)")


def step_inputs(graph: Graph) -> tuple[dict[str, str], dict[str, str]]:
    """The parameters and optimizer state of a step graph read back from a spec (its
    placeholders' names, `train.step`): parameter i is the input `param_<i>` whose new value
    is the output `new_param_<i>` (its user name is not in the graph), its state
    `state_<slot>_<i>`. A GraphError where it has none."""
    params = {node_id: node_id for node_id in _parameters(graph)}
    if not params:
        raise GraphError(f"the graph has no parameter placeholders (param_0, param_1, ...) "
                         f"with new values (new_param_0, ...): "
                         f"it is not a training step's graph (its inputs: "
                         f"{', '.join(map(shown, [n.id for n in graph.inputs][:8]))})")
    state = {}
    for n in graph.inputs:
        found = _STATE.fullmatch(n.id)
        if found and f"param_{found.group(2)}" in params:
            state[f"{found.group(1)}/param_{found.group(2)}"] = n.id
    return params, state


def is_step(graph: Graph) -> bool:
    """Whether `graph` is a training step's (see `step_inputs`)."""
    return bool(_parameters(graph))


def _parameters(graph: Graph) -> list[str]:
    """The inputs `param_<i>` whose new value is the output `new_param_<i>`."""
    outputs = {name for name, _ in graph.outputs}
    return [n.id for n in graph.inputs if _PARAM.fullmatch(n.id) and "new_" + n.id in outputs]
