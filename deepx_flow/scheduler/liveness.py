"""Whether the daemon that claimed a tick is gone, decided from what the database and this
host can tell; pure, so tests can give any answers.

A daemon names itself `host:pid` in the rows it writes. A tick it claimed and never
finished is abandoned once that daemon is gone:
- anywhere, when the schedule records that it stopped (a clean stop writes `stopped_at`);
- on this host, when its process no longer runs, when it is this very process (which has
  just started, so the pid is an earlier life's, reused), or when its heartbeat on the
  schedule is older than `STALE_AFTER_S` (the pid was reused by some other program);
- on another host, whose processes we cannot see, when its heartbeat is older than
  `STALE_AFTER_S`, or when the schedule no longer names it (another daemon took over).
The daemon's main loop beats every few seconds and never waits on a run, so a live daemon
is never taken for a gone one.
"""

from __future__ import annotations

from collections.abc import Callable

STALE_AFTER_S = 180.0


def daemon_gone(daemon: str | None, *, me: str, host: str, pid_alive: Callable[[int], bool],
                heartbeat_at: float | None, now: float,
                stale_after: float = STALE_AFTER_S, stopped: bool = False) -> bool:
    """Whether `daemon` ("host:pid") is gone. `heartbeat_at` is its last heartbeat on the
    schedule, or None when the schedule names another daemon (or none); `stopped`, whether
    the schedule records that it stopped."""
    if not daemon or daemon == me or stopped:
        return True
    stale = heartbeat_at is not None and now - heartbeat_at > stale_after
    its_host, _, pid = daemon.rpartition(":")
    if its_host == host and pid.isdigit():
        return stale or not pid_alive(int(pid))
    return heartbeat_at is None or stale
