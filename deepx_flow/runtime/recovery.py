"""How a run recovers from failed, hung and lost work: `dx.Recovery`, and what it means for
each task of a plan.

Settings come at three levels, the later overriding the earlier field by field: the run's
(`dx.run(..., recovery=dx.Recovery(...))`, also `persist` and `materialize`), an
operator's (`Recovery(operators={"matmul": {"timeout": 600}})`, matched against every
operator a task runs, fused ones included), and an asset's (`@dx.asset(recovery=...)`, for
the tasks that compute that asset).

Per task: `retries` go to Dask as its retry count; `backoff` is the wait before the second
attempt, doubled for each later one (at most `backoff_max`). A task running far past what its
peers take (`speculation_factor` times its expected time, at least `speculation_min`
seconds) gets a backup attempt on another worker while it goes on, and the first result wins
(`speculate`); slowness alone never fails a run. Only an explicit `timeout` does: an attempt
running longer is abandoned on its worker and run again on another ("drift"), and a task
that times out three times fails. Expected: the median time of this run's finished tasks of
the same step once three have finished, before that the registry's measured speed of its
operators on the slowest worker (`registry/speeds.py`), when there is one.

Per run: a worker whose tasks drift `exclude_after` times gets no more of the run's work;
a run with no workers waits `worker_wait` seconds for one, then fails; a run that fails
because a task ran out of memory is planned again with half the memory budget (smaller
chunks), at most `replan_on_oom` times; a materialization reads a lost chunk of a stored
asset back from storage when that is cheaper than computing it again (`read_back`,
`readback.py`), and one that finds a stored upstream version missing or damaged computes it
again from its lineage (`recompute_damaged`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from deepx_flow.config import WEEK_S
from deepx_flow.errors import InputError, shown
from deepx_flow.ir.keys import node_of

TASK_FIELDS = ("retries", "backoff", "backoff_max", "timeout", "speculate",
               "speculation_factor", "speculation_min")
FLAGS = ("read_back", "recompute_damaged", "speculate")
COUNTS = ("retries", "exclude_after", "replan_on_oom")
SECONDS = ("backoff", "backoff_max", "timeout", "speculation_min", "worker_wait")
# The most a count may be: far more than any run needs, and within what Dask's messages carry.
MAX_COUNT = 1_000_000


@dataclass(frozen=True)
class Recovery:
    """What a run does when its tasks fail, hang, or lose their worker.

    Parameters
    ----------
    retries : int
        Attempts after the first for a task that raises (Dask's retries).
    backoff, backoff_max : float
        Seconds to wait before the second attempt; doubled for each later one, capped.
    timeout : float, optional
        Seconds one attempt may run before it is abandoned and run on another worker; a
        task that times out three times fails the run (None: no limit, the default).
    speculate : bool
        Give an attempt running far past its expected time a backup attempt on another
        worker; the first to finish is the result.
    speculation_factor : float
        How far past: this many times its expected time...
    speculation_min : float
        ...and at least this many seconds.
    exclude_after : int
        Offences of one worker (a task drifted away from it, or beaten by its backup) before
        it gets no more of the run's tasks.
    worker_wait : float
        Seconds a run with no workers waits for one before it fails.
    replan_on_oom : int
        Times a run that ran out of memory is planned again with smaller chunks.
    read_back : bool
        Read a lost chunk of a stored asset back from storage instead of computing it again,
        when the cost model says that is cheaper (materializations only).
    recompute_damaged : bool
        A materialization that finds a stored upstream version missing or damaged (a chunk
        gone, or failing its checksum) materializes that upstream again from its lineage
        and goes on; False makes it fail with the DataError instead.
    operators : mapping
        Operator name -> overrides of the task fields above, e.g. {"matmul": {"retries": 3}}.
    """

    retries: int = 0
    backoff: float = 0.5
    backoff_max: float = 30.0
    timeout: float | None = None
    speculate: bool = True
    speculation_factor: float = 4.0
    speculation_min: float = 1.0
    exclude_after: int = 2
    worker_wait: float = 60.0
    replan_on_oom: int = 2
    read_back: bool = True
    recompute_damaged: bool = True
    operators: Mapping[str, Mapping] = field(default_factory=dict)

    def __post_init__(self):
        _check(self.__dict__, "recovery settings")
        if not isinstance(self.operators, Mapping):
            raise InputError(f"recovery settings: operators={shown(self.operators)} is not a "
                             f"mapping of operator name -> settings, e.g. "
                             f"{{'matmul': {{'retries': 3}}}}")
        for op, overrides in self.operators.items():
            if not isinstance(overrides, Mapping):
                raise InputError(f"recovery settings of operator {shown(op)}: "
                                 f"{shown(overrides)} is not a mapping of settings, e.g. "
                                 f"{{'retries': 3}}")
            _overridden(self, overrides, f"recovery settings of operator {shown(op)}")

    @classmethod
    def of(cls, recovery) -> "Recovery":
        """The `recovery=` argument of a run: a Recovery as given, None the defaults;
        anything else is an InputError saying what it takes."""
        if recovery is None:
            return cls()
        if not isinstance(recovery, Recovery):
            raise InputError(f"recovery must be a dx.Recovery (e.g. dx.Recovery(retries=2)) "
                             f"or None, got {type(recovery).__name__} {shown(recovery)}")
        return recovery

    def merged(self, overrides) -> "Recovery":
        """These settings with `overrides` (a Recovery, or a mapping of task fields) on top."""
        if overrides is None:
            return self
        if isinstance(overrides, Recovery):
            return overrides
        return _overridden(self, overrides, "recovery overrides")


@dataclass(frozen=True)
class TaskPolicy:
    """The settings that apply to the tasks of one node of a plan."""

    retries: int
    backoff: float
    backoff_max: float
    timeout: float | None
    speculate: bool
    speculation_factor: float
    speculation_min: float
    expected_s: float  # one task's time on the slowest worker (0 when unknown)
    expected_measured: bool = False  # expected_s comes from measured operator speeds


def task_policies(plan, recovery: Recovery, owners: Mapping[str, Recovery] | None = None,
                  inlined: Mapping[str, frozenset] | None = None) -> dict[str, TaskPolicy]:
    """Node id (of `plan.fused`) -> the policy of its tasks.

    `owners` maps node ids to the Recovery of the asset they compute (its overrides win
    over the run's and the operators'). `inlined` maps node ids to the nodes whose chunks
    their tasks compute inline (`compiler.inline`): their operators' settings apply too."""
    stats = {s.node: s for s in plan.stats().nodes}
    nodes = {n.id: n for n in plan.fused.nodes}
    out = {}
    for node in plan.fused.nodes:
        settings = recovery
        ops = operators_of(node).union(*(operators_of(nodes[i]) for i in
                                         (inlined or {}).get(node.id, ()) if i in nodes))
        for op in sorted(ops):
            if op in recovery.operators:
                settings = _overridden(settings, recovery.operators[op], op)
        if owners and node.id in owners:
            settings = settings.merged(owners[node.id])
        expected, measured = expected_seconds(node, stats.get(node.id), plan.cluster, [
            nodes[i] for i in (inlined or {}).get(node.id, ()) if i in nodes])
        out[node.id] = TaskPolicy(*(getattr(settings, f) for f in TASK_FIELDS),
                                  expected_s=expected, expected_measured=measured)
    return out


def operators_of(node) -> set[str]:
    """Every operator a task of `node` runs: its own, and those fused into it."""
    ops = {node.op}
    for part in ("program", "prologue", "epilogue"):
        for op, _, _ in node.attr(part) or ():
            ops.add(op)
    return ops


def expected_seconds(node, stats, cluster, inlined=()) -> tuple[float, bool]:
    """One task's time on the slowest worker, and whether that comes from measurement: the
    registry's measured speed of the node's operator (with the sources `inlined` into its
    tasks) on each worker where it has one (`registry/speeds.py`), else the cost model's
    rates (0 when nothing is known)."""
    from deepx_flow.ir.program import speed_label
    if stats is None or not stats.tasks or not cluster.workers:
        return 0.0, False
    flops = stats.flops / stats.tasks
    moved = (stats.bytes_in + stats.bytes_out) / stats.tasks
    label = speed_label(node, inlined)
    slowest, measured = 0.0, True
    for w in cluster.workers:
        speed = w.speeds.get(label)
        if speed is not None:
            seconds = speed.seconds(flops, moved)
        else:
            measured = False
            rate, memory = w.elementwise_rate, w.memory_rate
            seconds = max(flops / rate if rate else 0.0, moved / memory if memory else 0.0)
        slowest = max(slowest, seconds)
    return slowest, measured


def _overridden(base: Recovery, overrides: Mapping, where: str) -> Recovery:
    unknown = [name for name in overrides if name not in TASK_FIELDS]
    if unknown:
        raise InputError(f"{where}: unknown recovery setting(s) "
                         f"{shown(sorted(map(str, unknown)))}; per operator or asset these "
                         f"can be set: {', '.join(TASK_FIELDS)}")
    _check(dict(overrides), where)
    return replace(base, operators={}, **dict(overrides))


def _check(values: Mapping, where: str) -> None:
    """Refuse settings (all or some of Recovery's fields) that cannot mean anything."""
    def bad(name, why):
        raise InputError(f"{where}: {name}={shown(values[name])} {why}")
    for f in fields(Recovery):
        if f.name == "operators" or f.name not in values:
            continue
        value = values[f.name]
        if value is None:
            if f.name != "timeout":  # the one setting that can be left unset
                bad(f.name, "must be set (only timeout may be None)")
            continue
        if f.name in FLAGS:
            if not isinstance(value, bool):
                bad(f.name, "is not True or False")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or isinstance(value, float) and math.isnan(value):
            bad(f.name, "is not a number")
        if value < 0:
            bad(f.name, "is negative")
        if f.name in COUNTS and not isinstance(value, int):
            bad(f.name, "is not a whole number")
        if f.name in COUNTS and value > MAX_COUNT:
            bad(f.name, f"is more than {MAX_COUNT:,}")
        if f.name in SECONDS and not value <= WEEK_S:
            bad(f.name, f"is more than a week ({WEEK_S:,.0f} s)" +
                ("; None means no limit" if f.name == "timeout" else ""))
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # an int past any float
            finite = False
        if not finite:
            bad(f.name, "is not finite")
    if values.get("timeout") == 0:
        bad("timeout", "must be positive (None: no absolute limit)")
    if values.get("speculation_factor", 1) < 1:
        bad("speculation_factor", "must be at least 1 (a backup of a task not yet late "
                                  "would only double the work)")
    if values.get("exclude_after", 1) < 1:
        bad("exclude_after", "must be at least 1")


class ByKey:
    """A per-task `workers` annotation: `[by_key[key]]`, else every worker in `everywhere`
    (Dask takes a restriction for every task of the graph, so a task left free is one allowed
    anywhere). Pickled to the scheduler like `ByNode`."""

    def __init__(self, by_key: dict, everywhere: list):
        self.by_key, self.everywhere = by_key, list(everywhere)

    def __call__(self, key):
        where = self.by_key.get(key)
        return self.everywhere if where is None else [where]


class ByNode:
    """A per-task Dask annotation: `by_node[node id of the key]`, else `default`. Dask
    calls it on the scheduler for each task of a graph, so it must pickle."""

    def __init__(self, by_node: dict, default=None):
        self.by_node, self.default = by_node, default

    def __call__(self, key):
        return self.by_node.get(node_of(key), self.default)
