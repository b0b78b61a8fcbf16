"""The schedules page's listings over a small database: schedules with their tick counts,
last tick and their daemon's state (stopped when it recorded a clean stop, else alive or gone
by the rule `liveness.daemon_gone` applies to a daemon on another host), and ticks with
their run's status, filtered, paged and sorted in the database as Python sorts the expected
rows."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlmodel import select

from deepx_flow.meta.models import GraphRecord, Run, Schedule, ScheduleTick
from deepx_flow.scheduler.liveness import STALE_AFTER_S, daemon_gone
from deepx_flow.ui.pages.schedules import SCHEDULES, TICKS, schedule_names
from tests.ui.paging import every_page, matches

NAMES = ("hourly", "daily", "nightly", "weekly", "idle")
STATUSES = ("launched", "skipped", "failed")
# Heartbeat ages, far enough from STALE_AFTER_S that the seconds a test takes change nothing.
AGES = (None, -30.0, 5.0, 60.0, STALE_AFTER_S - 60.0, STALE_AFTER_S + 60.0, 1e5)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    db = open_db(f"sqlite:///{tmp_path_factory.mktemp('ui-schedules') / 'deepx.db'}")
    rng = random.Random(5)
    now = time.time()
    schedules = []
    for name in NAMES:
        age = rng.choice(AGES)
        schedules.append(Schedule(
            name=name, cron=rng.choice(["0 * * * *", "*/5 * * * *"]), selection=name,
            timezone=rng.choice(["UTC", "Europe/Paris"]),
            definitions=rng.choice([None, "defs.py"]),
            daemon=None if age is None else rng.choice([None, f"host{rng.randint(1, 3)}:7"]),
            heartbeat_at=None if age is None else now - age, updated_at=now))
    # One daemon stopped cleanly, its heartbeat still fresh: "stopped", not "alive".
    schedules[0].daemon, schedules[0].heartbeat_at, schedules[0].stopped_at = \
        "host1:7", now - 5.0, now - 5.0
    runs = [Run(id=f"run{i}", graph_hash="g", started_at=1.7e9 + i,
                status=rng.choice(["running", "succeeded", "failed"]), scheduler="s",
                cluster="c", n_workers=1, n_tasks=1, n_chunks=1, host="h", pid=1,
                username="u") for i in range(6)]
    ticks = [ScheduleTick(schedule=name, tick_at=1.7e9 + 60.0 * k, status=rng.choice(STATUSES),
                          run_id=rng.choice([None, "run0", "run3", "run5", "run-not-recorded"]),
                          message=rng.choice([None, "ok", "stale: no"]),
                          daemon=rng.choice([None, "host1:7"]),
                          started_at=1.7e9 + rng.randint(0, 5),
                          finished_at=rng.choice([None, 1.8e9 + rng.randint(0, 5)]))
             for name in NAMES[:-1] + ("gone-from-code",) for k in range(rng.randint(0, 9))]
    with db.session() as s:
        s.add(GraphRecord(hash="g", n_nodes=1, created_at=0.0))
        s.flush()
        s.add_all(runs + schedules + ticks)
    with db.read() as s:
        schedules = list(s.exec(select(Schedule)))
        ticks = list(s.exec(select(ScheduleTick)))
    yield db, schedules, ticks, {r.id: r.status for r in runs}
    close_all()


def state(s: Schedule, now: float) -> str:
    if s.stopped_at is not None:
        return "stopped"
    gone = daemon_gone(s.daemon, me="the dashboard", host="the dashboard's host",
                       pid_alive=lambda pid: True, heartbeat_at=s.heartbeat_at, now=now)
    return "gone" if gone else "alive"


def schedule_rows(schedules, ticks, now):
    out = []
    for s in schedules:
        mine = [t.tick_at for t in ticks if t.schedule == s.name]
        out.append({"name": s.name, "cron": s.cron, "selection": s.selection,
                    "timezone": s.timezone, "ticks": len(mine),
                    "tick": max(mine) if mine else None, "daemon": s.daemon,
                    "seen": s.heartbeat_at, "state": state(s, now),
                    "definitions": s.definitions})
    return out


def tick_rows(ticks, run_status, schedule, status):
    return [{"schedule": t.schedule, "tick": t.tick_at, "status": t.status, "run": t.run_id,
             "run_status": run_status.get(t.run_id), "message": t.message,
             "daemon": t.daemon, "started": t.started_at, "ended": t.finished_at, "id": t.id}
            for t in ticks if schedule in (None, t.schedule) and status in (None, t.status)]


@settings(max_examples=30, deadline=None)
@given(sort=st.sampled_from(list(SCHEDULES.columns)), descending=st.booleans(),
       size=st.integers(1, 6))
def test_schedules_have_their_tick_counts_and_daemon_liveness(seeded, sort, descending, size):
    db, schedules, ticks, _ = seeded
    want = schedule_rows(schedules, ticks, time.time())
    assert sorted(r["state"] for r in want).count("stopped") == 1
    assert {r["state"] for r in want} == {"alive", "stopped", "gone"}
    matches(SCHEDULES, db, want, sort, descending, size, "name")


@settings(max_examples=40, deadline=None)
@given(sort=st.sampled_from(list(TICKS.columns)), descending=st.booleans(),
       size=st.integers(1, 12), schedule=st.sampled_from([None, *NAMES, "gone-from-code"]),
       status=st.sampled_from([None, *STATUSES]))
def test_ticks_with_their_runs_filter_page_and_sort_in_the_database(seeded, sort, descending,
                                                                   size, schedule, status):
    db, _, ticks, run_status = seeded
    want = tick_rows(ticks, run_status, schedule, status)
    matches(TICKS, db, want, sort, descending, size, "id", schedule=schedule, status=status)


def test_a_tick_shows_the_status_of_its_run(seeded):
    db, _, ticks, run_status = seeded
    rows = every_page(TICKS, db, "tick", False, 100)
    assert {(r["run"], r["run_status"]) for r in rows if r["run"]} == \
        {(t.run_id, run_status.get(t.run_id)) for t in ticks if t.run_id}
    assert any(r["run"] == "run-not-recorded" and r["run_status"] is None for r in rows)


def test_schedule_names_are_listed_in_order(seeded):
    db, schedules, _, _ = seeded
    assert schedule_names(db) == sorted(s.name for s in schedules)
    assert schedule_names(db, limit=2) == sorted(s.name for s in schedules)[:2]
