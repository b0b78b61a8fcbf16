"""Runs whose driver died are marked interrupted when the database is next opened."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from sqlmodel import select

from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.meta.models import ChunkPlacement, Event, GraphRecord, Run
from deepx_flow.meta.orphans import driver_gone, interrupt_orphaned_runs, process_started
from deepx_flow.processes import Process, pid_space
from tests.meta.test_db import new_run


@pytest.mark.parametrize("process_start, gone", [
    (None, True),         # no such process
    (1000.0, False),      # started before the run: the run's own driver, alive
    (1001.9, False),      # within the slack of start-time rounding
    (1010.0, True),       # started after the run: the pid was reused
])
def test_driver_gone(process_start, gone):
    assert driver_gone(4242, 1000.0, lambda pid: process_start) is gone


def test_process_started_sees_this_process_and_not_a_dead_one():
    assert process_started(os.getpid()) <= time.time()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert process_started(child.pid) is None


def test_open_db_marks_the_runs_of_dead_drivers(db_url):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    here, space = socket.gethostname(), pid_space()
    assert space  # Linux: this process's boot id and PID namespace
    other_boot = "0" * 8 + space[8:]  # a machine of the same name (an NFS root shared)
    other_ns = space.rsplit(":", 1)[0] + ":1"  # a container of the same host name
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="g", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
    with db.session() as s:
        mine = dict(host=here, pid_space=space)
        s.add(new_run("dead", "g", pid=child.pid, started_at=time.time() - 60, **mine))
        s.add(new_run("alive", "g", pid=os.getpid(), started_at=time.time(), **mine))
        s.add(new_run("elsewhere", "g", host="another-host", pid=child.pid, pid_space=space))
        s.add(new_run("over", "g", pid=child.pid, status="succeeded", **mine))
        # The same host name, pids of another PID space: its driver cannot be seen here.
        s.add(new_run("other-boot", "g", host=here, pid=child.pid, pid_space=other_boot))
        s.add(new_run("other-ns", "g", host=here, pid=child.pid, pid_space=other_ns))
        s.add(new_run("unknown", "g", host=here, pid=child.pid))  # recorded before spaces
    with db.session() as s:
        for state, worker in (("memory", "w1"), ("spilled", "w2"), ("released", "w3")):
            s.add(ChunkPlacement(run_id="dead", tensor="x@1", chunk="0", worker=worker,
                                 state=state, updated_at=1.0))
    close_all()

    db = open_db(db_url)  # a new process would do this: it finds the dead driver's run
    with db.read() as s:
        status = dict(s.exec(select(Run.id, Run.status)).all())
        dead = s.get(Run, "dead")
        states = dict(s.exec(select(ChunkPlacement.worker, ChunkPlacement.state)).all())
        events = s.exec(select(Event.run_id, Event.kind)).all()
    assert status == {"dead": "interrupted", "alive": "running", "elsewhere": "running",
                      "over": "succeeded", "other-boot": "running", "other-ns": "running",
                      "unknown": "running"}
    assert f"{here}:{child.pid} died before the run finished" in dead.error
    assert dead.ended_at is not None
    assert states == {"w1": "lost", "w2": "lost", "w3": "released"}
    assert events == [("dead", "driver-lost")]
    assert interrupt_orphaned_runs(db) == []  # once


def test_a_process_that_can_look_up_no_pid_marks_nothing(db_url):
    """Without a PID space of its own (no /proc, or one of another PID namespace), a process
    cannot tell a live driver from a dead one: it leaves every run as it is."""
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="g", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
    with db.session() as s:
        s.add(new_run("r", "g", host="h", pid=7, pid_space=None))
        s.add(new_run("s", "g", host="h", pid=8, pid_space="b/4:5"))
    gone = lambda pid: None  # noqa: E731 (every pid looks gone)
    assert interrupt_orphaned_runs(db, Process("h", None, 1), started=gone) == []
    assert interrupt_orphaned_runs(db, Process("h", "b/4:6", 1), started=gone) == []
    assert interrupt_orphaned_runs(db, Process("h", "b/4:5", 1), started=gone) == ["s"]
