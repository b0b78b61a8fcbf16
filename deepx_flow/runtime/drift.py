"""When to back a slow task up, when to drift a timed-out one, when to stop trusting a worker:
pure decisions.

`RunWatch` follows one run through events (a task started on a worker, finished, failed on
a broken device; a backup attempt started or finished first; the number of workers changed;
time passed) and answers with actions. It never calls Dask: the supervisor
(`supervisor.py`) feeds it the scheduler's events and carries out what it returns, and tests
drive it with events alone.

- Slow is never fatal by default. An attempt running far past what its peers take (more
  than `speculation_factor` times the median of the run's finished tasks of the same step,
  and at least `speculation_min` seconds) gets one backup attempt on another worker while it
  goes on (`Speculate`; one per task); whichever finishes first is the result. Before
  `MEASURED_AFTER` peers have finished, the expected time is the registry's measured speed
  of the operator, when there is one; an estimate from the cost model alone starts no
  backup. A task on a worker short of memory (paused, or spilling to disk) gets none while
  it is: it is slow for want of memory, not for a bad device, and a backup would copy its
  inputs to another worker, taking memory the cluster lacks (a training in pieces, whose
  every worker spills, was slowed to a standstill by its backups).
- Only an explicit absolute `timeout` fails anything for slowness: an attempt running longer
  is abandoned on its worker and run again elsewhere (`Drift`); a task that times out
  `MAX_TIMEOUTS` times fails (the task hangs, not the workers).
- A worker gets an offence when a task is drifted away from it, or when a backup of one of
  its tasks finished first (it really was slower); the first makes it suspect (its tasks are
  backed up past half the factor, at least 1.5x, and half the floor), `exclude_after` of
  them exclude it from the run's remaining work.
- A device error (lost GPU) excludes its worker at once.
- With no workers for `worker_wait` seconds the run gives up.

"Running" is the time an attempt has spent on its worker executing (or waiting on a worker
with idle threads, which is how a task a worker never got looks); the supervisor works it out
from the workers' heartbeats, so a task queued behind its worker's other tasks is not slow.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from deepx_flow.runtime.recovery import TaskPolicy

MEASURED_AFTER = 3  # finished tasks of a node before their median replaces the estimate
MAX_TIMEOUTS = 3  # timeouts of one task before it fails instead of drifting again
SUSPECT_FACTOR = 1.5  # the least factor a suspect worker's tasks are backed up past


@dataclass(frozen=True)
class Speculate:
    """Start a backup attempt of `key` (running on `worker`) on a worker not in `avoid`."""
    key: object
    worker: str
    avoid: frozenset
    reason: str


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
    node: str  # whose policy applies
    peers: str  # whose finished times say how long it should take
    worker: str
    since: float


class RunWatch:
    """The recovery decisions for one run. `node_of(key)` names a key's node (a policy
    key); `peers_of(key)` the tasks whose times it is compared with (default: its node's;
    the supervisor gives a node's internal steps, such as a reduction's partial sums and
    their combining, peers of their own, since they take very different times)."""

    def __init__(self, policies: dict[str, TaskPolicy], node_of, exclude_after: int = 2,
                 worker_wait: float = 60.0, peers_of=None):
        self.policies, self.node_of = policies, node_of
        self.peers_of = peers_of or node_of
        self.exclude_after, self.worker_wait = exclude_after, worker_wait
        self.running: dict = {}  # key -> _Attempt
        self.backups: dict = {}  # key -> _Attempt of its live backup (None until it starts)
        self.speculated: set = set()  # keys given a backup: one each, even if it failed
        self.durations: dict[str, list[float]] = defaultdict(list)  # peers -> finished times
        self.medians: dict[str, tuple] = {}  # peers -> (count it was taken at, median)
        self.drifts: dict = defaultdict(int)  # key -> times it timed out
        self.offences: dict[str, int] = defaultdict(int)
        self.excluded: dict[str, str] = {}  # worker -> why
        self.no_workers_since: float | None = None
        self.gave_up = False

    # -- events --------------------------------------------------------------------------------

    def started(self, key, worker: str, at: float) -> None:
        self.running[key] = _Attempt(self.node_of(key), self.peers_of(key), worker, at)

    def finished(self, key, at: float) -> float | None:
        """The attempt succeeded; returns how long it ran (None if it was not seen start).
        Its backup, if any, is no longer needed (the supervisor releases it)."""
        attempt = self.running.pop(key, None)
        self.backups.pop(key, None)
        if attempt is None:
            return None
        self.durations[attempt.peers].append(at - attempt.since)
        return at - attempt.since

    def moved(self, key, worker: str) -> None:
        """The attempt of `key` now runs on `worker` (Dask's work stealing moves a task that
        has not started to an idle worker, without a transition)."""
        attempt = self.running.get(key)
        if attempt is not None:
            attempt.worker = worker

    def stopped(self, key) -> None:
        """The attempt ended without a result (failed, released, its worker died)."""
        self.running.pop(key, None)

    def backup_started(self, key, worker: str, at: float) -> None:
        if key in self.backups:
            self.backups[key] = _Attempt(self.node_of(key), self.peers_of(key), worker, at)

    def backup_finished(self, key, at: float) -> list:
        """The backup of `key` finished before the attempt it backs up: that attempt is
        abandoned (the supervisor hands the backup's result to the key), and its worker gets
        an offence."""
        backup = self.backups.pop(key, None)
        attempt = self.running.pop(key, None)
        if backup is not None:
            self.durations[backup.peers].append(at - backup.since)
        if attempt is None:
            return []
        took = f"{at - backup.since:.1f} s" if backup is not None else "less"
        return self._offence(attempt.worker, f"a backup of {key} finished first ({took} on "
                                             f"{backup.worker if backup else 'another'}; it "
                                             f"ran {at - attempt.since:.1f} s there)")

    def backup_stopped(self, key) -> None:
        """The backup failed, was dropped or could not start: the first attempt goes on
        alone (a key gets one backup: a failed one is not tried again)."""
        self.backups.pop(key, None)

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
        finished ones (their mean while fewer than `MEASURED_AFTER`), else the policy's
        estimate (0 for a node without a policy)."""
        peers = self.peers_of(key)
        measured = self._measured(peers)
        if measured is not None:
            return measured
        if self.durations.get(peers):
            return statistics.fmean(self.durations[peers])
        policy = self.policies.get(self.node_of(key))
        return 0.0 if policy is None else policy.expected_s

    # -- time ----------------------------------------------------------------------------------

    def tick(self, now: float, running_for: Callable | None = None,
             short_of_memory: Callable | None = None) -> list:
        """Decisions at time `now`. `running_for(key)` gives the seconds an attempt has been
        running on its worker, or None while it waits behind other work there (default: the
        time since it started); `short_of_memory(worker)` says whether a worker is paused or
        spilling (default: none is)."""
        actions = self._give_up_if_waited(now)
        for key, attempt in list(self.running.items()):
            policy = self.policies.get(attempt.node)
            if policy is None:
                continue
            ran = now - attempt.since if running_for is None else running_for(key)
            if ran is None:
                continue
            if policy.timeout is not None and ran > policy.timeout:
                actions += self._timed_out(key, attempt, ran, policy.timeout)
            elif policy.speculate and key not in self.speculated:
                factor, floor = policy.speculation_factor, policy.speculation_min
                if self.offences.get(attempt.worker):  # suspect: back its tasks up sooner
                    factor, floor = max(SUSPECT_FACTOR, factor / 2), floor / 2
                limit = self._backup_after(attempt.peers, policy, factor, floor)
                # (the worker's memory asked only of an attempt past its limit: it reads
                # the scheduler's state of that worker)
                if limit is not None and ran > limit and not (
                        short_of_memory is not None and short_of_memory(attempt.worker)):
                    self.speculated.add(key)
                    self.backups[key] = None
                    avoid = frozenset(self.excluded) | {attempt.worker}
                    actions.append(Speculate(key, attempt.worker, avoid,
                                             f"ran {ran:.1f} s on {attempt.worker}, past "
                                             f"{limit:.1f} s ({factor:g}x its expected "
                                             f"time)"))
        return actions

    # -- internals -----------------------------------------------------------------------------

    def _backup_after(self, peers: str, policy: TaskPolicy, factor: float, floor: float
                      ) -> float | None:
        """Seconds after which an attempt among `peers` gets a backup; None while nothing
        trustworthy says how long it should take."""
        expected = self._measured(peers)
        if expected is None and policy.expected_measured:
            expected = policy.expected_s
        if expected is None:
            return None
        return max(floor, factor * expected)

    def _timed_out(self, key, attempt: _Attempt, ran: float, limit: float) -> list:
        del self.running[key]
        reason = f"ran {ran:.1f} s on {attempt.worker}, over its limit of {limit:.1f} s"
        self.drifts[key] += 1
        if self.drifts[key] >= MAX_TIMEOUTS:
            return [FailTask(key, attempt.worker, f"timed out {self.drifts[key]} times "
                                                  f"(last: {reason})")]
        # The attempt is moved first, then its worker judged (excluding it moves the tasks it
        # has not started, and the timed-out one must be drifted, not moved with them).
        offence = self._offence(attempt.worker, reason)
        avoid = frozenset(self.excluded) | {attempt.worker}
        return [Drift(key, attempt.worker, attempt.since, avoid, reason)] + offence

    def _measured(self, peers: str) -> float | None:
        times = self.durations.get(peers, ())
        if len(times) < MEASURED_AFTER:
            return None
        n, median = self.medians.get(peers, (0, None))
        # Refreshed as the count grows (every time up to 64, then every 64th): a node
        # with many tasks must not cost a sort per task start.
        if n != len(times) and (len(times) <= 64 or len(times) >= n + 64):
            median = statistics.median(times)
            self.medians[peers] = (len(times), median)
        return median

    def _offence(self, worker: str, reason: str) -> list:
        if worker in self.excluded:
            return []
        self.offences[worker] += 1
        if self.offences[worker] >= self.exclude_after:
            self.excluded[worker] = f"{self.offences[worker]} of its tasks drifted away or " \
                                    f"beaten by a backup (last: {reason})"
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
