"""The overview page without a browser: its listings (runs in flight, failed runs with the
first line of their error, erred tasks of the latest runs) against what the database holds,
the scheduler read through one cached watch per address (a real 2-worker cluster), an
unreachable one said so in time, and a failing refresh shown in the page, not raised."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from deepx_flow.meta.models import GraphRecord, Run, Task
from deepx_flow.ui import cluster_state as cs
from deepx_flow.ui.pages.overview import (ERRED_TASKS, FAILED_RUNS, IN_FLIGHT, LATEST_RUNS,
                                          RECENT_RUNS, Overview, overview_page)
from deepx_flow.ui import scheduler_watch as sw
from deepx_flow.ui.scheduler_watch import watch
from tests.ui.paging import every_page

STATUSES = ("running", "succeeded", "failed", "interrupted")


def _run(i: int, status: str) -> Run:
    return Run(id=f"run{i:03d}", graph_hash="g", status=status, started_at=1.7e9 + i,
               ended_at=None if status == "running" else 1.7e9 + i + 0.5,
               error=f"ValueError: bad {i}\nTraceback (most recent call last):\n  ..."
               if status == "failed" else None,
               scheduler="tcp://10.0.0.1:8786", cluster="c", n_workers=1, n_tasks=3,
               n_chunks=1, host="elsewhere", pid=1, username="ann")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Runs of every status; each run has three tasks, its first one erred."""
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    db = open_db(f"sqlite:///{tmp_path_factory.mktemp('overview') / 'deepx.db'}")
    runs = [_run(i, STATUSES[i % 4]) for i in range(RECENT_RUNS + 30)]
    with db.session() as s:
        s.add(GraphRecord(hash="g", n_nodes=1, created_at=0.0))
        s.add_all(runs)
        s.flush()
        s.add_all([Task(run_id=r.id, key=f"('x@t', {k})", tensor="x@t", operator="add",
                        worker="tcp://10.0.0.1:1", start=r.started_at, stop=r.started_at + k,
                        status="erred" if k == 0 else "memory",
                        error=f"RuntimeError: {r.id}\nmore" if k == 0 else None)
                   for r in runs for k in range(3)])
    yield db, runs
    close_all()


def test_the_listings_hold_what_the_database_holds(db):
    db, runs = db
    in_flight = every_page(IN_FLIGHT, db, "started", True, 7)
    assert [r["id"] for r in in_flight] == [r.id for r in reversed(runs)
                                            if r.status == "running"]
    latest = every_page(LATEST_RUNS, db, "started", True, 7)
    assert [(r["id"], r["status"]) for r in latest] == [(r.id, r.status)
                                                        for r in reversed(runs)]
    assert all(r["error"] == (f"ValueError: bad {int(r['id'][3:])}"
                              if r["status"] == "failed" else "") for r in latest)
    failed = every_page(FAILED_RUNS, db, "started", True, 7)
    assert [r["id"] for r in failed] == [r.id for r in reversed(runs) if r.status == "failed"]
    assert all(r["error"] == f"ValueError: bad {int(r['id'][3:])}" for r in failed)
    erred = every_page(ERRED_TASKS, db, "at", True, 9)
    latest = [r.id for r in sorted(runs, key=lambda r: -r.started_at)][:RECENT_RUNS]
    assert [r["run"] for r in erred] == latest  # one erred task each, newest first
    assert all(r["error"] == f"RuntimeError: {r['run']}" and r["key"] == "('x@t', 0)"
               for r in erred)


def test_the_cluster_is_read_live_through_one_watch_per_address(db, scheduler):
    db, _ = db
    assert watch(scheduler) is watch(scheduler)
    reading = watch(scheduler).current(wait=5)
    assert reading.error is None and len(reading.identity["workers"]) == 2
    live = cs.live_workers(reading.identity)
    for address, info in reading.identity["workers"].items():
        assert live[address]["limit"] == info["memory_limit"] > 0
        assert live[address]["memory"] == info["metrics"]["memory"] > 0
    page = overview_page(db, scheduler)  # nothing registered for it: its workers, unregistered
    assert isinstance(page, Overview)
    rows = page.workers.listing.rows
    assert sorted(r["worker"] for r in rows) == sorted(reading.identity["workers"])
    assert {r["state"] for r in rows} == {"live, not registered"}
    assert f"Dask scheduler {scheduler}: 2 workers live" in page.scheduler_status.object
    port = reading.identity["services"]["dashboard"]
    assert f'href="http://127.0.0.1:{port}/status"' in page.dask_link.object
    assert page.gpus.visible is False and "No GPU" in page.gpus_note.object


def test_an_unreachable_scheduler_holds_no_page_up_and_is_said_once_read(db, monkeypatch):
    db, _ = db
    with socket.socket() as s:  # a port nothing listens on (and no other test's watch)
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    # The client retries a refused connect until its timeout: a long one here, so that a
    # page built on a busy machine is still far quicker than the read it must not wait for.
    slow = 10.0
    monkeypatch.setitem(sw._WATCHES, address, sw.SchedulerWatch(address, timeout=slow))
    started = time.monotonic()
    page = overview_page(db, address)
    assert page.scheduler_status.object == f"Reading the Dask scheduler at {address} ..."
    assert time.monotonic() - started < slow  # did not wait for the connect to fail
    assert watch(address).request().result(timeout=slow + 10).error  # the read fails
    page.refresh()
    assert f"{address} could not be reached" in page.scheduler_status.object
    assert "not known" in page.dask_link.object

    started = time.monotonic()  # the next page shows the failure at once, reads again behind
    again = overview_page(db, address)
    assert f"{address} could not be reached" in again.scheduler_status.object
    assert time.monotonic() - started < slow
    started = time.monotonic()  # however old the failure, no waiting on a new read
    assert watch(address).current(wait=slow + 10, fresh=0).error
    assert time.monotonic() - started < slow


def test_a_failing_refresh_is_shown_in_the_page(tmp_path):
    from deepx_flow.meta import open_db
    path = tmp_path / "gone.db"
    db = open_db(f"sqlite:///{path}")
    page = overview_page(db, None)
    page.refresh()
    assert page.refreshed.object.startswith("refreshed ")
    db.dispose()  # the database file is removed under the running dashboard
    for f in tmp_path.iterdir():
        Path(f).unlink()
    page.refresh()
    assert page.refreshed.object.startswith("refresh failed at ")
    assert "no such table" in page.refreshed.object


def test_only_live_workers_are_listed_unless_the_history_is_asked_for(tmp_path):
    """Live: running and seen within the heartbeat timeout, or reported by the scheduler the
    page reads now (however stale its row); the rest is counted, and listed with history."""
    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import StorageTier, Worker
    from deepx_flow.registry.heartbeat import TIMEOUT_S as STALE
    from deepx_flow.ui.pages.overview import registered_cluster, workers_note

    db = open_db(f"sqlite:///{tmp_path / 'deepx.db'}")
    now = 1.8e9
    rows = {("tcp://s:1", "tcp://a:1"): ("running", now - 1.0),  # beating
            ("tcp://s:1", "tcp://b:1"): ("running", now - STALE - 1.0),  # its driver died
            ("tcp://s:1", "tcp://c:1"): ("gone", now - 1.0),  # closed
            ("tcp://t:2", "tcp://d:2"): ("running", now - STALE - 60.0)}  # ... and t's too
    with db.session() as s:
        for (scheduler, address), (status, seen) in rows.items():
            worker = Worker(scheduler=scheduler, address=address, name=address, host="h",
                            protocol="tcp", nthreads=1, memory_limit=2**30, status=status,
                            first_seen=1.0, last_seen=seen)
            s.add(worker)
            s.flush()
            s.add(StorageTier(worker_id=worker.id, tier="host", location="memory",
                              capacity=2**30, registered_at=1.0))

    def listed(**kwargs):
        found = registered_cluster(db, now=now, **kwargs)
        return {r["address"]: r["gone"] for r in found.workers}, found

    shown, found = listed(scheduler=None)
    assert shown == {"tcp://a:1": False} and found.hidden == 3
    assert "3 registered workers of closed or gone clusters not shown" in \
        workers_note(None, found)
    shown, found = listed(scheduler="tcp://t:2", seen_live={"tcp://d:2"})  # its scheduler
    assert shown == {"tcp://d:2": False} and found.hidden == 0
    shown, _ = listed(scheduler="tcp://s:1", seen_live={"tcp://d:2"})  # not s's worker
    assert shown == {"tcp://a:1": False}
    shown, found = listed(scheduler=None, history=True)
    assert shown == {"tcp://a:1": False, "tcp://b:1": True, "tcp://c:1": True,
                     "tcp://d:2": True} and found.hidden == 0
    rows = cs.worker_rows(found.workers, None)
    assert [r["state"] for r in rows] == ["registered", "gone", "gone", "gone"]
    assert [r["storage"] for r in rows] == ["host 1.00 GiB"] * 4


def test_with_nothing_live_the_last_cluster_on_record_is_shown(tmp_path):
    """A script's embedded cluster is gone when the script exits: without a scheduler to
    read, the overview showed no worker at all. It shows the cluster seen last, marked
    gone, and says so; a live worker, or the history box, shows what it did before."""
    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import Worker
    from deepx_flow.registry.heartbeat import TIMEOUT_S as STALE
    from deepx_flow.ui.pages.overview import shown_cluster, workers_note
    from deepx_flow.ui.table import utc_text

    db = open_db(f"sqlite:///{tmp_path / 'deepx.db'}")
    now = 1.8e9
    assert shown_cluster(db, None, now=now).workers == []  # nothing registered: nothing
    seen = {("tcp://old:1", "tcp://o1:1"): now - 7200.0,
            ("tcp://last:2", "tcp://l1:2"): now - 600.0,
            ("tcp://last:2", "tcp://l2:2"): now - 650.0}
    with db.session() as s:
        for (scheduler, address), at in seen.items():
            s.add(Worker(scheduler=scheduler, address=address, name=address, host="h",
                         protocol="tcp", nthreads=1, memory_limit=2**30, status="running",
                         first_seen=1.0, last_seen=at))
    found = shown_cluster(db, None, now=now)
    assert {r["address"]: r["gone"] for r in found.workers} == {"tcp://l1:2": True,
                                                                "tcp://l2:2": True}
    assert found.last_known == ("tcp://last:2", now - 600.0)
    assert workers_note(None, found) == (
        f"No live workers: the last cluster on record is shown, tcp://last:2 (its workers "
        f"last seen {utc_text(now - 600.0)} UTC; the history box lists every cluster's).")
    assert [r["state"] for r in cs.worker_rows(found.workers, None)] == ["gone", "gone"]
    every = shown_cluster(db, None, history=True, now=now)
    assert len(every.workers) == 3 and every.last_known is None
    with db.session() as s:  # a driver beating for the old cluster again: it is live
        s.add(Worker(scheduler="tcp://old:1", address="tcp://o2:1", name="o2", host="h",
                     protocol="tcp", nthreads=1, status="running", first_seen=1.0,
                     last_seen=now - STALE / 2))
    found = shown_cluster(db, None, now=now)
    assert [r["address"] for r in found.workers] == ["tcp://o2:1"] and not found.last_known
