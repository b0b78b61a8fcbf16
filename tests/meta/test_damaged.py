"""Databases that cannot be trusted are refused, never re-created or migrated: a 0-byte SQLite
file (its history is gone), and a damaged schema row (deleted, duplicated, a version that no
deepx_flow ever wrote). Each is one `DatabaseError`, exit 2 from the command line."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest
from sqlalchemy import text

from deepx_flow.errors import DatabaseError
from deepx_flow.meta.db import close_all, open_db
from deepx_flow.meta.models import GraphRecord, Run
from tests.meta.test_db import new_run, raw_engine, snapshot


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _with_history(url: str) -> None:
    """A database with one recorded run in it, closed again."""
    db = open_db(url)
    with db.session() as s:
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
        s.add(new_run("r1", "abc", status="succeeded"))
    close_all()


# --- a 0-byte SQLite file ------------------------------------------------------------------

def test_a_truncated_database_file_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "deepx.db"
    url = f"sqlite:///{path.as_posix()}"
    _with_history(url)
    assert path.stat().st_size > 0
    path.write_bytes(b"")  # a failed copy, a full disk, `> deepx.db`

    with pytest.raises(DatabaseError) as err:
        open_db(url)

    message = str(err.value)
    assert str(path) in message and "0 bytes" in message
    assert "delete" in message and "--db" in message  # how to start afresh
    assert "\n" not in message
    assert path.stat().st_size == 0  # not re-created empty over the lost history
    assert [p.name for p in tmp_path.iterdir()] == ["deepx.db"]


def test_an_empty_database_file_exits_2_from_the_cli(tmp_path):
    path = tmp_path / "deepx.db"
    path.touch()
    res = cli("runs", "--db", f"sqlite:///{path.as_posix()}")
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "is empty (0 bytes)" in res.stderr and str(path) in res.stderr
    assert path.stat().st_size == 0


OPENERS = 6


def _open(url: str, start, results) -> None:
    """In a child process: wait for the others, open the database, report the error."""
    try:
        start.wait()
        open_db(url)
        results.put(None)
    except BaseException as err:
        results.put(f"{type(err).__name__}: {err}")


@pytest.mark.slow
def test_processes_creating_a_new_file_at_once_never_see_it_empty(tmp_path):
    """A new file appears whole, so processes opening it while another creates it never find
    0 bytes and refuse it (a file SQLite itself creates is empty until its first write)."""
    # Forked from a server that has imported the database code once: spawned processes
    # each spent seconds importing it before they reached the barrier.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["deepx_flow.meta"])
    for attempt in range(3):
        path = tmp_path / f"r{attempt}" / "deepx.db"
        start, results = ctx.Barrier(OPENERS), ctx.Queue()
        procs = [ctx.Process(target=_open, args=(f"sqlite:///{path.as_posix()}", start,
                                                 results)) for _ in range(OPENERS)]
        for proc in procs:
            proc.start()
        errors = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert errors == [None] * OPENERS
        assert path.read_bytes()[:16] == b"SQLite format 3\x00"
        assert [p.name for p in path.parent.iterdir() if ".new" in p.name] == []


# --- a damaged schema row ------------------------------------------------------------------

DAMAGE = {
    "deleted": ("DELETE FROM deepx_schema", "no row"),
    "negative": ("UPDATE deepx_schema SET version = -3", "version -3"),
    "zero": ("UPDATE deepx_schema SET version = 0", "version 0"),
    "duplicated": ("INSERT INTO deepx_schema (id, version) VALUES (2, 1)", "2 rows"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_schema_row_is_a_database_error_and_nothing_changes(db_url, damage):
    _with_history(db_url)
    statement, says = DAMAGE[damage]
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text(statement))
    engine.dispose()
    before = snapshot(db_url)

    with pytest.raises(DatabaseError) as err:
        open_db(db_url)

    message = str(err.value)
    assert "damaged schema version" in message and says in message
    assert "deepx_schema" in message and "backup" in message and "\n" not in message
    assert snapshot(db_url) == before  # not migrated, not written


def test_a_damaged_schema_row_exits_2_from_the_cli(db_url):
    _with_history(db_url)
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM deepx_schema"))
    engine.dispose()

    res = cli("runs", "--db", db_url)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "damaged schema version (no row" in res.stderr
    assert snapshot(db_url)["runs"][0]["id"] == "r1"


def test_a_run_row_survives_refusal(db_url):
    """What was there before the damage is still readable by hand after the refusal."""
    _with_history(db_url)
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE deepx_schema SET version = -1"))
    engine.dispose()
    with pytest.raises(DatabaseError):
        open_db(db_url)
    assert [r["id"] for r in snapshot(db_url)[Run.__tablename__]] == ["r1"]
