"""The schema version is checked by every transaction, not once per process: a process that
opened the database keeps no way to write into a schema another process has changed since
(upgraded by a newer deepx_flow, or replaced by an older copy), on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from sqlalchemy import text
from sqlmodel import select

from deepx_flow.errors import DatabaseError
from deepx_flow.meta import store
from deepx_flow.meta.migrations import SCHEMA_VERSION
from deepx_flow.meta.models import GraphRecord, Run
from tests.meta.test_db import new_run, raw_engine, snapshot

UPGRADE = f"""
import sys
from sqlalchemy import create_engine, text
engine = create_engine(sys.argv[1])
with engine.begin() as conn:  # what a newer deepx_flow's migration does
    conn.execute(text("ALTER TABLE tasks ADD COLUMN queued_seconds FLOAT"))
    conn.execute(text("UPDATE deepx_schema SET version = {SCHEMA_VERSION + 1}"))
engine.dispose()
"""


def _upgrade_in_another_process(url: str) -> None:
    done = subprocess.run([sys.executable, "-c", UPGRADE, url], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_writes_stop_once_another_process_upgraded_the_schema(db):
    with db.session() as s:  # the process has used the database: its connection is pooled
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
        s.add(new_run("r1", "abc"))
    _upgrade_in_another_process(db.url)
    before = snapshot(db.url)

    with pytest.raises(DatabaseError) as err:
        with db.session() as s:
            s.add(new_run("r2", "abc"))
    message = str(err.value)
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert f"opened it at version {SCHEMA_VERSION}" in message and "\n" not in message
    # The recorder's batched writes are refused the same way.
    with pytest.raises(DatabaseError, match="schema version"):
        store.write_records(db, "r1", [], [], [(time.time(), "note", None, None, "x")])
    with pytest.raises(DatabaseError, match="schema version"):
        with db.read() as s:
            s.exec(select(Run)).all()
    assert snapshot(db.url) == before


def test_a_refused_transaction_holds_no_lock(db):
    """After a refusal, other connections write at once (SQLite's write lock, taken by
    BEGIN IMMEDIATE before the check, is given back)."""
    with db.session() as s:
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
    engine = raw_engine(db.url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE deepx_schema SET version = :v"), {"v": SCHEMA_VERSION + 1})
    with pytest.raises(DatabaseError):
        with db.session() as s:
            s.add(new_run("r2", "abc"))
    began = time.monotonic()
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA busy_timeout=2000")
        conn.execute(text("UPDATE deepx_schema SET version = :v"), {"v": SCHEMA_VERSION})
    assert time.monotonic() - began < 1.0
    engine.dispose()
    with db.session() as s:  # back at its version: the same process writes again
        s.add(new_run("r3", "abc"))
    with db.read() as s:
        assert s.exec(select(Run.id)).all() == ["r3"]


def test_a_database_replaced_by_an_older_copy_is_refused(db):
    with db.session() as s:
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
    engine = raw_engine(db.url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE deepx_schema SET version = :v"), {"v": SCHEMA_VERSION - 1})
    engine.dispose()
    with pytest.raises(DatabaseError, match=f"schema version {SCHEMA_VERSION - 1}, older"):
        with db.session() as s:
            s.add(new_run("r2", "abc"))
