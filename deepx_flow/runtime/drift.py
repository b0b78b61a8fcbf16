"""When to drift a task to another worker, and when to stop trusting a worker: pure decisions.

`RunWatch` follows one run through events (a task started on a worker, finished, failed
on a broken device; the number of workers changed; time passed) and answers with actions.
It never calls Dask: the supervisor (`supervisor.py`) feeds it the scheduler's events and
carries out what it returns, and tests drive it with events alone.

- An attempt running longer than its limit (`TaskPolicy.limit`, with the median time of
  the run's finished tasks of the same node once `MEASURED_AFTER` have finished) is
  drifted: abandoned on its worker and run again elsewhere. The worker gets an offence:
  the first makes it suspect, `exclude_after` of them exclude it from the run's remaining
  work. A task that times out `MAX_TIMEOUTS` times fails: the task hangs, not the workers.
- A device error (lost GPU) excludes its worker at once and drifts the task.
- With no workers for `worker_wait` seconds the run gives up.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from deepx_flow.runtime.recovery import TaskPolicy

MEASURED_AFTER = 3  # finished tasks of a node before their median replaces the estimate
MAX_TIMEOUTS = 3  # timeouts of one task before it fails instead of drifting again


@dataclass(frozen=True)
class Drift:
    """Abandon `key`'s attempt on `worker` (begun at `since`); run it again on a worker not
    in `avoid`."""
    key: object
    worker: str
    since: float
    avoid: frozenset
    reason: str


@dataclass(frozen=True)
class Suspect:
    worker: str
    reason: str


@dataclass(frozen=True)
class Exclude:
    """Give `worker` none of the run's remaining tasks."""
    worker: str
    reason: str


@dataclass(frozen=True)
class FailTask:
    key: object
    worker: str | None
    reason: str


@dataclass(frozen=True)
class GiveUp:
    """Fail the run's unfinished tasks."""
    reason: str


@dataclass
class _Attempt:
    node: str
    worker: str
    since: float
    limit: float | None


class RunWatch:
    """The drift decisions for one run. `node_of(key)` names a key's node (a policy key)."""

    def __init__(self, policies: dict[str, TaskPolicy], node_of, exclude_after: int = 2,
                 worker_wait: float = 60.0):
        self.policies, self.node_of = policies, node_of
        self.exclude_after, self.worker_wait = exclude_after, worker_wait
        self.running: dict = {}  # key -> _Attempt
        self.durations: dict[str, list[float]] = defaultdict(list)  # node -> finished times
        self.medians: dict[str, tuple] = {}  # node -> (count it was taken at, median)
        self.drifts: dict = defaultdict(int)  # key -> times it timed out
        self.offences: dict[str, int] = defaultdict(int)
        self.excluded: dict[str, str] = {}  # worker -> why
        self.no_workers_since: float | None = None
        self.gave_up = False

    # -- events --------------------------------------------------------------------------------

    def started(self, key, worker: str, at: float) -> None:
        node = self.node_of(key)
        policy = self.policies.get(node)
        self.running[key] = _Attempt(node, worker, at, None if policy is None else
                                     policy.limit(self._measured(node)))

    def finished(self, key, at: float) -> float | None:
        """The attempt succeeded; returns how long it ran (None if it was not seen start)."""
        attempt = self.running.pop(key, None)
        if attempt is None:
            return None
        self.durations[attempt.node].append(at - attempt.since)
        return at - attempt.since

    def stopped(self, key) -> None:
        """The attempt ended without a result (failed, released, its worker died)."""
        self.running.pop(key, None)

    def device_failed(self, key, worker: str, kind: str, message: str) -> list:
        """A task failed on `worker` with a device error (`kind`: "device-lost")."""
        self.running.pop(key, None)
        actions = []
        if worker not in self.excluded:
            reason = f"{kind} on {worker}: {message}"
            self.excluded[worker] = reason
            actions.append(Exclude(worker, reason))
        return actions

    def workers(self, count: int, at: float) -> list:
        """The cluster now has `count` workers."""
        if count > 0:
            self.no_workers_since = None
            return []
        if self.no_workers_since is None:
            self.no_workers_since = at
        return self._give_up_if_waited(at)

    def expected(self, key) -> float:
        """Seconds a task of `key`'s node is expected to take: the median of the run's
        finished ones (their mean while fewer than `MEASURED_AFTER`), else the cost model's
        estimate (0 for a node without a policy)."""
        node = self.node_of(key)
        measured = self._measured(node)
        if measured is not None:
            return measured
        if self.durations.get(node):
            return statistics.fmean(self.durations[node])
        policy = self.policies.get(node)
        return 0.0 if policy is None else policy.expected_s

    # -- time ----------------------------------------------------------------------------------

    def tick(self, now: float) -> list:
        actions = self._give_up_if_waited(now)
        for key, attempt in list(self.running.items()):
            if attempt.limit is None or now - attempt.since <= attempt.limit:
                continue
            del self.running[key]
            ran = now - attempt.since
            reason = f"ran {ran:.1f} s on {attempt.worker}, over its limit of " \
                     f"{attempt.limit:.1f} s"
            self.drifts[key] += 1
            if self.drifts[key] >= MAX_TIMEOUTS:
                actions.append(FailTask(key, attempt.worker, f"timed out {self.drifts[key]} "
                                        f"times (last: {reason})"))
                continue
            actions += self._offence(attempt.worker, reason)
            avoid = frozenset(self.excluded) | {attempt.worker}
            actions.append(Drift(key, attempt.worker, attempt.since, avoid, reason))
        return actions

    # -- internals -----------------------------------------------------------------------------

    def _measured(self, node: str) -> float | None:
        times = self.durations.get(node, ())
        if len(times) < MEASURED_AFTER:
            return None
        n, median = self.medians.get(node, (0, None))
        # Refreshed as the count grows (every time up to 64, then every 64th): a node
        # with many tasks must not cost a sort per task start.
        if n != len(times) and (len(times) <= 64 or len(times) >= n + 64):
            median = statistics.median(times)
            self.medians[node] = (len(times), median)
        return median

    def _offence(self, worker: str, reason: str) -> list:
        if worker in self.excluded:
            return []
        self.offences[worker] += 1
        if self.offences[worker] >= self.exclude_after:
            self.excluded[worker] = f"{self.offences[worker]} tasks drifted away from it " \
                                    f"(last: {reason})"
            return [Exclude(worker, self.excluded[worker])]
        if self.offences[worker] == 1:
            return [Suspect(worker, reason)]
        return []

    def _give_up_if_waited(self, now: float) -> list:
        if (self.gave_up or self.no_workers_since is None
                or now - self.no_workers_since < self.worker_wait):
            return []
        self.gave_up = True
        return [GiveUp(f"no workers for {now - self.no_workers_since:.0f} s (waited "
                       f"{self.worker_wait:g} s for a replacement)")]
