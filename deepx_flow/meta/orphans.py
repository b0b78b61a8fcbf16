"""Runs whose driver died: found when deepx_flow next opens the database, and marked.

A run's row says `running` until the process that started it ends it. A process killed
outright (SIGKILL, the OOM killer, a lost machine) never does, so each process, when it
first opens a database, looks at the runs still `running` whose driver it can look up by
pid: those of its own host name and PID space (`processes.can_look_up`: one boot of one
kernel, one PID namespace). A run whose process no longer exists, or whose pid now belongs
to a process started after the run (the pid was reused), is marked `interrupted`, and the
chunks it recorded as held are marked `lost` (its client is gone, so Dask has dropped
them). Its asset versions are untouched: a version is published only complete, so the last
complete one stays.

Runs of any other driver are left alone, for a process that can see it: one on another
host, in another container of the same host name (its own PID namespace), or on another
machine of the same name (another boot id); and runs recorded before drivers recorded
their PID space (schema version 13), whose pid may be anyone's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlmodel import select, update

from deepx_flow.meta.models import ChunkPlacement, Event, Run
from deepx_flow.processes import Process, this_process

log = logging.getLogger(__name__)

# A process counts as the run's own if it started no later than this after the run did
# (process start times are rounded; a run starts after its process).
START_SLACK_S = 2.0


def driver_gone(run_pid: int, run_started_at: float,
                process_started: Callable[[int], float | None]) -> bool:
    """Whether the process that started a run, one this process can look up by pid
    (`processes.can_look_up`), is gone: no process has its pid,
    or the one that has it started after the run (a reused pid). `process_started(pid)`
    gives a process's start time, or None when there is none."""
    started = process_started(run_pid)
    return started is None or started > run_started_at + START_SLACK_S


def process_started(pid: int) -> float | None:
    """The start time of process `pid` on this host; None when it does not exist (or is a
    zombie, which will never end a run)."""
    import psutil
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None if not psutil.pid_exists(pid) else 0.0


def interrupt_orphaned_runs(db, me: Process | None = None,
                            started: Callable[[int], float | None] = process_started) -> list[str]:
    """Mark the runs whose driver `me` (default: this process) can look up and finds gone
    `interrupted` (their held chunks `lost`, with an event saying why); return their ids."""
    me = me or this_process()
    if me.space is None:
        return []  # this process can look up no other by pid
    with db.read() as session:
        running = session.exec(select(Run.id, Run.pid, Run.started_at)
                               .where(Run.status == "running", Run.host == me.host,
                                      Run.pid_space == me.space)).all()
    # This process's own pid counts too: a run with it is ours only if we started first.
    gone = [(run_id, pid) for run_id, pid, began in running
            if driver_gone(pid, began, started)]
    if not gone:
        return []
    now = time.time()
    with db.session() as session:
        for run_id, pid in gone:
            message = (f"the driver process {me.host}:{pid} died before the run finished; "
                       f"found by process {me.pid}")
            ended = session.exec(update(Run).where(Run.id == run_id, Run.status == "running")
                                 .values(status="interrupted", ended_at=now, error=message))
            if ended.rowcount != 1:
                continue  # another process marked it first
            session.exec(update(ChunkPlacement)
                         .where(ChunkPlacement.run_id == run_id,
                                ChunkPlacement.state.in_(("memory", "spilled")))
                         .values(state="lost", updated_at=now))
            session.add(Event(run_id=run_id, at=now, kind="driver-lost", message=message))
    log.warning("deepx_flow: marked %d run(s) interrupted whose driver died: %s", len(gone),
                ", ".join(run_id[:12] for run_id, _ in gone))
    return [run_id for run_id, _ in gone]


__all__ = ["driver_gone", "interrupt_orphaned_runs", "process_started"]
