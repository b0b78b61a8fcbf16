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
    here = socket.gethostname()
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="g", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
    with db.session() as s:
        s.add(new_run("dead", "g", host=here, pid=child.pid, started_at=time.time() - 60))
        s.add(new_run("alive", "g", host=here, pid=os.getpid(), started_at=time.time()))
        s.add(new_run("elsewhere", "g", host="another-host", pid=child.pid))
        s.add(new_run("over", "g", host=here, pid=child.pid, status="succeeded"))
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
                      "over": "succeeded"}
    assert f"{here}:{child.pid} died before the run finished" in dead.error
    assert dead.ended_at is not None
    assert states == {"w1": "lost", "w2": "lost", "w3": "released"}
    assert events == [("dead", "driver-lost")]
    assert interrupt_orphaned_runs(db) == []  # once
