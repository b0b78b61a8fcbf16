"""Whether the daemon that claimed a tick is gone (pure: the process table is a stub)."""

from __future__ import annotations

from deepx_flow.scheduler.liveness import STALE_AFTER_S, daemon_gone

NOW = 1_000_000.0


def gone(daemon, heartbeat_at=NOW - 1, alive=(7,)):
    return daemon_gone(daemon, me="here:99", host="here", pid_alive=lambda pid: pid in alive,
                       heartbeat_at=heartbeat_at, now=NOW)


def test_on_this_host_the_process_table_decides():
    assert not gone("here:7")
    assert gone("here:8")  # no such process
    assert gone("here:99")  # this process, just started: an earlier life with the same pid
    assert gone("here:7", heartbeat_at=NOW - STALE_AFTER_S - 1)  # pid reused by another
    assert not gone("here:7", heartbeat_at=None)  # alive, the schedule moved to another daemon
    assert gone(None)


def test_on_another_host_the_heartbeat_decides():
    assert not gone("there:8")
    assert gone("there:8", heartbeat_at=NOW - STALE_AFTER_S - 1)
    assert gone("there:8", heartbeat_at=None)  # the schedule names another daemon now
