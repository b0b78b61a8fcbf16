"""Where a run's time goes: checking, planning, lowering, recording, submitting, the
cluster's work, gathering.

    with dx.phases() as timed:
        dx.run(expr)
    timed  # {"check": 0.0004, "connect": 0.002, "plan": 0.0001, ..., "cluster": 1.21, ...}

`dx.phases()` collects the wall seconds of each phase of the `dx.run` calls made in its block
(summed over several runs; a block inside another collects its own), so that a benchmark or
a user can tell a run's fixed costs from the work itself. "cluster" runs from the end of the
submission until the last output chunk is computed; "gather" is what gathering takes after
that (its transfers before it overlap the cluster's work). What no phase covers (making the
client, the progress bar) is the call's wall time less their sum. `dx.persist`,
`dx.materialize` and `dx.train` add the phases they share with a run (lower, record,
submit). Outside such a block a phase costs one context-variable lookup.
"""

from __future__ import annotations

import contextlib
import threading
import time
from contextvars import ContextVar

_current: ContextVar[dict | None] = ContextVar("deepx_phases", default=None)

# The phases of a run, in the order they happen.
PHASES = ("check", "connect", "plan", "lower", "record", "submit", "cluster", "gather",
          "finish")


@contextlib.contextmanager
def phases():
    """Collect the seconds of each phase of the runs made in the block: a dict of phase
    name -> seconds, filled as the runs go (see the module docstring)."""
    timed: dict[str, float] = {}
    token = _current.set(timed)
    try:
        yield timed
    finally:
        _current.reset(token)


def measuring() -> bool:
    return _current.get() is not None


@contextlib.contextmanager
def phase(name: str):
    """Add the block's wall seconds to phase `name` when phases are being collected."""
    timed = _current.get()
    if timed is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - start)


def add(name: str, seconds: float) -> None:
    timed = _current.get()
    if timed is not None:
        timed[name] = timed.get(name, 0.0) + seconds


class Completion:
    """When the last of some futures finished, as the client heard of it (their done
    callbacks). `Completion.of` gives None when phases are not being collected."""

    def __init__(self, futures):
        self.last, self.waiting = 0.0, len(futures)
        self._lock = threading.Lock()
        for future in futures:
            future.add_done_callback(self._done)

    def _done(self, _future) -> None:
        now = time.perf_counter()
        with self._lock:
            self.last = max(self.last, now)
            self.waiting -= 1

    @classmethod
    def of(cls, futures) -> "Completion | None":
        return cls(futures) if measuring() else None


@contextlib.contextmanager
def cluster_then_gather(completion: Completion | None):
    """Time a gather that starts as the cluster's work is submitted: the seconds until the
    last future finished go to "cluster", the rest to "gather". A callback not run yet (they
    run on one thread of their own) leaves the whole gather to the cluster rather than to a
    fixed cost."""
    start = time.perf_counter()
    try:
        yield
    finally:
        end = time.perf_counter()
        last = end if completion is None or completion.waiting > 0 else completion.last
        waited = min(max(last, start), end) - start
        add("cluster", waited)
        add("gather", end - start - waited)
