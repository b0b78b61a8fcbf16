"""Which registered workers are alive (`registry/heartbeat.py`): the staleness rule and the
beat's decisions, without sleeping; the database writes on a real SQLite file; and the
heartbeat of a real cluster held by this process, kept seen while its client runs and
marked gone when the user closes it (a client of a scheduler elsewhere only stops beating).
The processes that end (exit, dx.shutdown, SIGTERM, SIGKILL, a forked child) are in
test_heartbeat_processes.py."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.config import settings
from deepx_flow.errors import SettingsError
from deepx_flow.meta.models import Worker
from deepx_flow.registry import heartbeat
from deepx_flow.registry.heartbeat import (beat_step, is_live, live_since, mark_stale_gone,
                                           refresh, shown_status)
from tests.helpers import threaded_memory_off

# --- the rule -----------------------------------------------------------------------------


def test_a_row_is_live_while_running_and_seen_within_the_timeout():
    assert is_live("running", 100.0, 160.0, timeout=60.0)
    assert is_live("running", 100.0, 100.0, timeout=60.0)
    assert not is_live("running", 100.0, 160.001, timeout=60.0)
    assert not is_live("gone", 159.0, 160.0, timeout=60.0)  # marked gone: gone, however fresh
    assert not is_live("running", None, 160.0, timeout=60.0)
    assert shown_status("running", 100.0, 150.0, timeout=60.0) == "running"
    assert shown_status("running", 100.0, 170.0, timeout=60.0) == "gone"
    assert shown_status("gone", 150.0, 150.0, timeout=60.0) == "gone"


def test_the_timeout_and_the_beat_come_from_the_settings(monkeypatch):
    monkeypatch.delenv("DEEPX_HEARTBEAT_TIMEOUT_S", raising=False)
    monkeypatch.delenv("DEEPX_HEARTBEAT_S", raising=False)
    assert live_since(1000.0) == 1000.0 - heartbeat.TIMEOUT_S == 940.0
    assert heartbeat.TIMEOUT_S >= 10 * heartbeat.PERIOD_S  # several beats, for busy machines
    monkeypatch.setenv("DEEPX_HEARTBEAT_TIMEOUT_S", "7.5")
    monkeypatch.setenv("DEEPX_HEARTBEAT_S", "0.25")
    assert live_since(1000.0) == 992.5
    assert is_live("running", 993.0, 1000.0) and not is_live("running", 992.0, 1000.0)
    assert settings().heartbeat_s == 0.25


@pytest.mark.parametrize("name", ["DEEPX_HEARTBEAT_S", "DEEPX_HEARTBEAT_TIMEOUT_S"])
@pytest.mark.parametrize("text", ["0", "-5", "soon", "inf", "nan"])
def test_a_setting_that_is_not_a_positive_number_of_seconds_is_refused(monkeypatch, name,
                                                                        text):
    monkeypatch.setenv(name, text)
    with pytest.raises(SettingsError, match=f"{name} must be a number of seconds, above 0 "
                                            f"and at most 604,800, got '{text}'"):
        settings()


@pytest.mark.parametrize("client, cluster, step", [
    ("running", None, "refresh"),  # a scheduler elsewhere, connected
    ("running", "running", "refresh"),  # a cluster of this process, running
    ("connecting", None, "wait"),  # reconnecting: neither seen nor let go
    ("newly-created", "running", "wait"),
    ("closed", None, "drop"),  # the user closed a client of a scheduler elsewhere
    ("closing", None, "drop"),
    ("closed", "running", "gone"),  # the user closed the client of this process's cluster
    ("running", "closed", "gone"),  # ... or the cluster itself, its client not noticing yet
    ("connecting", "closing", "gone"),
    ("running", "failed", "gone"),
])
def test_what_a_beat_does(client, cluster, step):
    assert beat_step(client, cluster) == step


# --- the database -------------------------------------------------------------------------


def _worker(scheduler: str, address: str, last_seen: float, status: str = "running"):
    return Worker(scheduler=scheduler, address=address, name=address, host="h",
                  protocol="tcp", nthreads=1, status=status, first_seen=1.0,
                  last_seen=last_seen)


def _statuses(db) -> dict:
    with db.read() as s:
        return {(w.scheduler, w.address): (w.status, w.last_seen)
                for w in s.exec(select(Worker))}


def test_a_beat_refreshes_the_workers_the_scheduler_lists_and_nothing_else(sqlite_db):
    with sqlite_db.session() as s:
        s.add_all([_worker("tcp://s:1", "tcp://a:1", 10.0),
                   _worker("tcp://s:1", "tcp://b:1", 10.0),
                   _worker("tcp://s:1", "tcp://c:1", 10.0, "gone"),
                   _worker("tcp://t:1", "tcp://a:1", 10.0)])  # same address, another cluster
    assert refresh(sqlite_db, "tcp://s:1", {"tcp://a:1": 1, "tcp://c:1": 1}, 50.0) == 2
    assert _statuses(sqlite_db) == {
        ("tcp://s:1", "tcp://a:1"): ("running", 50.0),
        ("tcp://s:1", "tcp://b:1"): ("running", 10.0),  # not listed: it goes stale
        ("tcp://s:1", "tcp://c:1"): ("running", 50.0),  # listed again: back
        ("tcp://t:1", "tcp://a:1"): ("running", 10.0)}
    assert refresh(sqlite_db, "tcp://s:1", [], 60.0) == 0
    assert refresh(sqlite_db, "tcp://s:1", ["tcp://a:1"], 40.0) == 0  # never back in time


def test_readers_mark_the_stale_rows_gone(sqlite_db):
    with sqlite_db.session() as s:
        s.add_all([_worker("tcp://s:1", "tcp://a:1", 100.0),
                   _worker("tcp://s:1", "tcp://b:1", 139.0),
                   _worker("tcp://s:1", "tcp://c:1", 141.0)])
    assert mark_stale_gone(sqlite_db, 200.0, timeout=60.0) == 2
    assert {a: st for (_, a), (st, _) in _statuses(sqlite_db).items()} == \
        {"tcp://a:1": "gone", "tcp://b:1": "gone", "tcp://c:1": "running"}
    assert mark_stale_gone(sqlite_db, 200.0, timeout=60.0) == 0


# --- a cluster this process holds ---------------------------------------------------------


def _rows(db, scheduler: str) -> list[Worker]:
    with db.read() as s:
        return list(s.exec(select(Worker).where(Worker.scheduler == scheduler)))


def _wait(condition, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """Runs recorded in a fresh database, with a beat of 0.2 s."""
    from deepx_flow.meta import open_db
    url = f"sqlite:///{(tmp_path / 'd.db').as_posix()}"
    monkeypatch.setenv("DEEPX_DB_URL", url)
    monkeypatch.setenv("DEEPX_HEARTBEAT_S", "0.2")
    return open_db(url)


def _threaded_cluster():
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=False, host="127.0.0.1",
                        protocol="tcp", dashboard_address="127.0.0.1:0",
                        silence_logs=logging.ERROR)


def _run_on(client) -> None:
    out = dx.run(dx.arange(10.0).sum(), client=client)
    assert float(np.asarray(out)) == 45.0


@pytest.mark.timeout(180)
def test_a_cluster_is_kept_seen_and_marked_gone_when_its_user_closes_the_client(recorded):
    with threaded_memory_off(), _threaded_cluster() as cluster:
        client = Client(cluster, set_as_default=False)
        try:
            _run_on(client)
            scheduler = client.scheduler.address
            assert scheduler in heartbeat.held()
            registered = max(w.last_seen for w in _rows(recorded, scheduler))
            _wait(lambda: all(w.last_seen > registered + 0.3
                              for w in _rows(recorded, scheduler)), "two beats or more")
            assert {w.status for w in _rows(recorded, scheduler)} == {"running"}
        finally:
            client.close()  # as a user does: nothing of deepx_flow is called
        # The next beat sees the client of this process's cluster closed.
        _wait(lambda: {w.status for w in _rows(recorded, scheduler)} == {"gone"},
              "the workers marked gone")
        assert scheduler not in heartbeat.held()
        seen = {w.address: w.last_seen for w in _rows(recorded, scheduler)}
        time.sleep(1.0)  # five beats: none writes any more
        assert {w.address: w.last_seen for w in _rows(recorded, scheduler)} == seen


@pytest.mark.timeout(180)
def test_a_bad_setting_for_a_while_does_not_stop_the_beat(recorded, monkeypatch):
    """The beat reads its period from the settings each time: a bad DEEPX_* value there (any
    of them makes the settings unreadable) ended the thread, and no cluster of the process
    was seen again; its workers went stale while it kept running (seen in the suite when a
    settings test set one while a dashboard test's cluster was held)."""
    with threaded_memory_off(), _threaded_cluster() as cluster:
        client = Client(cluster, set_as_default=False)
        try:
            _run_on(client)
            scheduler = client.scheduler.address
            monkeypatch.setenv("DEEPX_HEARTBEAT_TIMEOUT_S", "inf")
            time.sleep(1.0)  # five beats' time with the settings unreadable
            monkeypatch.setenv("DEEPX_HEARTBEAT_TIMEOUT_S", "60")
            mended = time.time()
            _wait(lambda: all(w.last_seen > mended for w in _rows(recorded, scheduler)),
                  "a beat after the setting was mended", timeout=20.0)
            assert scheduler in heartbeat.held()
        finally:
            client.close()


@pytest.mark.timeout(180)
def test_a_client_of_a_scheduler_elsewhere_stops_beating_and_its_rows_go_stale(recorded):
    with threaded_memory_off(), _threaded_cluster() as cluster:
        client = Client(cluster.scheduler_address, set_as_default=False)  # no cluster object
        try:
            _run_on(client)
            scheduler = client.scheduler.address
            assert scheduler in heartbeat.held()
        finally:
            client.close()
        _wait(lambda: scheduler not in heartbeat.held(), "the client let go")
        rows = _rows(recorded, scheduler)
        # Not marked: another driver may still use that cluster. Seen no more, so readers
        # count it gone once the timeout has passed.
        assert {w.status for w in rows} == {"running"}
        last = max(w.last_seen for w in rows)
        time.sleep(1.0)
        assert max(w.last_seen for w in _rows(recorded, scheduler)) == last
        assert not any(is_live(w.status, w.last_seen, last + heartbeat.TIMEOUT_S + 1)
                       for w in rows)


@pytest.mark.timeout(180)
def test_shutdown_marks_the_embedded_cluster_gone_in_the_database_it_was_registered_in(
        recorded, tmp_path, monkeypatch):
    """The process moved to another directory since (a notebook's os.chdir): the rows are
    marked where they were written, not in the default database of the new directory."""
    from deepx_flow.runtime.cluster import shared_client
    monkeypatch.delenv("DEEPX_DB_URL")
    monkeypatch.delenv("DEEPX_SCHEDULER", raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    try:
        _run_on(shared_client())
        scheduler = shared_client().scheduler.address
        assert scheduler in heartbeat.held()
        monkeypatch.chdir(second)
    finally:
        dx.shutdown()
    from deepx_flow.meta import open_db
    db = open_db(f"sqlite:///{(first / '.deepx' / 'deepx.db').as_posix()}")
    assert {w.status for w in _rows(db, scheduler)} == {"gone"}
    assert scheduler not in heartbeat.held()
    assert not (second / ".deepx").exists()


def test_a_forgotten_database_is_not_written_when_the_cluster_goes(tmp_path):
    """A database about to be dropped (a test's) is forgotten: the cluster is marked gone in
    the others only (at exit, marking it in a dropped database would only fail)."""
    from deepx_flow.meta import open_db
    from deepx_flow.registry.register import register_cluster
    kept, dropped = (open_db(f"sqlite:///{tmp_path / name}") for name in ("kept.db", "gone.db"))
    with threaded_memory_off(), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                         dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        for db in (kept, dropped):
            register_cluster(client, db)
            heartbeat.hold(client, db)
        heartbeat.forget_database(dropped.url)
        assert heartbeat.release(client, gone=True)
    statuses = []
    for db in (kept, dropped):
        with db.read() as s:
            statuses.append({w.status for w in s.exec(select(Worker))})
    assert statuses == [{"gone"}, {"running"}]
