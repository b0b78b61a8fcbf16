"""The metadata database: creating, reopening, migrating and refusing databases, on SQLite and
on PostgreSQL (`db_url` runs each test on both), and many processes writing one SQLite file."""

from __future__ import annotations

import multiprocessing
import time
import traceback
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, inspect, text
from sqlalchemy.pool import NullPool
from sqlmodel import SQLModel, select

from deepx_flow.errors import DatabaseError
from deepx_flow.meta.db import Database, close_all, database_url, open_db
from deepx_flow.meta.migrations import SCHEMA_VERSION
from deepx_flow.meta.models import (AssetDefinition, AssetMaterialization, ChunkPlacement,
                                    Device, Event, GraphRecord, Operation, OperatorSpeed, Run,
                                    Schedule, SchemaInfo, ScheduleTick, ServedModelRecord,
                                    Task, Worker)
from tests.helpers import free_port

SCHEMA_V1 = Path(__file__).parent / "fixtures" / "schema_v1.sql"
V1_TABLES = {"deepx_schema", "workers", "devices", "storage_tiers", "operators", "links",
             "graphs", "runs", "tasks", "chunk_placements"}


# --- helpers: raw access, beside deepx_flow's own engine -----------------------------------

def raw_engine(url: str):
    """An engine with no deepx_flow settings and no pool: it sees the database as it is."""
    return create_engine(url, poolclass=NullPool)


def load_sql(url: str, path: Path) -> None:
    """Run the statements of a SQL file (see its header for the one SQLite substitution)."""
    engine = raw_engine(url)
    sql = "\n".join(line for line in path.read_text().splitlines()
                    if not line.lstrip().startswith("--"))
    if engine.dialect.name == "sqlite":
        sql = sql.replace(" SERIAL ", " INTEGER ")
    with engine.begin() as conn:
        for statement in sql.split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
    engine.dispose()


def snapshot(url: str) -> dict[str, list[dict]]:
    """Every row of every table, ordered by primary key, as the database holds them now."""
    engine = raw_engine(url)
    meta = MetaData()
    with engine.connect() as conn:
        meta.reflect(conn)
        rows = {name: [dict(r._mapping) for r in conn.execute(
                    select(table).order_by(*table.primary_key.columns))]
                for name, table in meta.tables.items()}
    engine.dispose()
    return rows


def columns(url: str) -> dict[str, dict[str, bool]]:
    """Table -> column -> nullable, as the database has them."""
    engine = raw_engine(url)
    with engine.connect() as conn:
        insp = inspect(conn)
        found = {t: {c["name"]: c["nullable"] for c in insp.get_columns(t)}
                 for t in insp.get_table_names()}
    engine.dispose()
    return found


def model_columns() -> dict[str, dict[str, bool]]:
    """Table -> column -> nullable, as `models.py` declares them."""
    return {name: {c.name: bool(c.nullable) for c in table.columns}
            for name, table in SQLModel.metadata.tables.items()}


def indexes(url: str) -> dict[str, set[tuple]]:
    """Table -> its indexes as (name, columns, unique), as the database has them (not the
    ones backing a unique constraint)."""
    engine = raw_engine(url)
    with engine.connect() as conn:
        insp = inspect(conn)
        found = {t: {(ix["name"], tuple(ix["column_names"]), bool(ix["unique"]))
                     for ix in insp.get_indexes(t) if not ix.get("duplicates_constraint")}
                 for t in insp.get_table_names()}
    engine.dispose()
    return found


def model_indexes() -> dict[str, set[tuple]]:
    """Table -> its indexes as `models.py` declares them."""
    return {name: {(ix.name, tuple(c.name for c in ix.columns), bool(ix.unique))
                   for ix in table.indexes}
            for name, table in SQLModel.metadata.tables.items()}


def stored_version(url: str) -> int:
    engine = raw_engine(url)
    with engine.connect() as conn:
        version = conn.execute(select(SchemaInfo.version)).scalar_one()
    engine.dispose()
    return version


def new_run(run_id: str, graph_hash: str, **kw) -> Run:
    fields = dict(id=run_id, graph_hash=graph_hash, started_at=time.time(), scheduler="inproc",
                  cluster="local", n_workers=2, n_tasks=1, n_chunks=1, host="here", pid=1,
                  username="alice")
    return Run(**{**fields, **kw})


# --- a new database ------------------------------------------------------------------------

def test_new_database_has_every_table_and_the_current_version(db_url):
    open_db(db_url)
    assert columns(db_url) == model_columns()
    assert indexes(db_url) == model_indexes()
    assert stored_version(db_url) == SCHEMA_VERSION


def test_opening_twice_is_fine(db_url):
    """Once per process from `open_db`; a second engine (another process) finds it current."""
    first = open_db(db_url)
    assert open_db(db_url) is first
    other = Database(db_url)  # migrates again: nothing to do
    other.dispose()
    close_all()
    assert open_db(db_url) is not first
    assert stored_version(db_url) == SCHEMA_VERSION


def test_a_database_given_where_a_url_may_be_is_used_as_it_is(db_url):
    """Every `db=` argument (dx.train, dx.status, dx.runs, ...) takes a URL or a Database."""
    own = Database(db_url)
    try:
        assert open_db(own) is own
        assert open_db(db_url) is not own  # a URL opens the process's own engine
    finally:
        own.dispose()


def test_rows_written_in_one_session_are_read_in_another(db, db_url):
    with db.session() as s:
        s.add(Worker(scheduler="tcp://s:8786", address="tcp://w:1", name="w0", host="h",
                     protocol="tcp", nthreads=2, memory_limit=3 * 2**40, first_seen=1.25,
                     last_seen=2.5))
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=3, created_at=1.0))
        s.add(new_run("r1", "abc", started_at=1767225600.123456, compute_comm_ratio=None))
    with db.session() as s:
        worker_id = s.exec(select(Worker.id)).one()
        s.add(Device(worker_id=worker_id, name="H100", memory_total=85520809984,
                     healthy=False, registered_at=3.0))
        s.add(Task(run_id="r1", key="('y@abc', 0)", tensor="y@abc", operator="fused(relu)",
                   bytes_in=6 * 2**30, start=10.5, stop=10.75))
        s.add(ChunkPlacement(run_id="r1", tensor="y@abc", chunk="0,1", worker="tcp://w:1",
                             nbytes=2**33, updated_at=11.0))
        s.add(Event(run_id="r1", at=12.0, kind="drift", message="moved"))
    close_all()

    with open_db(db_url).session() as s:
        run = s.get(Run, "r1")
        task = s.exec(select(Task)).one()
        device = s.exec(select(Device)).one()
        placement = s.exec(select(ChunkPlacement)).one()
        event = s.exec(select(Event)).one()
        worker = s.get(Worker, worker_id)
    assert (run.started_at, run.username, run.compute_comm_ratio, run.status) == \
        (1767225600.123456, "alice", None, "running")
    assert (task.bytes_in, task.start, task.stop, task.attempts) == (6 * 2**30, 10.5, 10.75, 1)
    assert (device.memory_total, device.healthy, device.kind) == (85520809984, False, "gpu")
    assert (placement.nbytes, placement.chunk, placement.tier) == (2**33, "0,1", "host")
    assert (event.run_id, event.kind, event.message) == ("r1", "drift", "moved")
    assert worker.memory_limit == 3 * 2**40


def test_task_summary_gives_python_numbers_on_each_backend(db):
    """Sums of BIGINT columns come back as ints (PostgreSQL's NUMERIC would be a Decimal,
    which the dashboard's tables cannot send)."""
    from deepx_flow.meta.queries import measured_ratio, task_summary
    with db.session() as s:
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=1, created_at=1.0))
        s.add(new_run("r1", "abc"))
    big = 3 * 2**40
    with db.session() as s:
        for i, (status, comm) in enumerate([("memory", 0.5), ("erred", None), ("memory", 1.5)]):
            s.add(Task(run_id="r1", key=f"('y@abc', {i})", tensor="y@abc", operator="relu",
                       start=10.0, stop=12.0, bytes_out=big, status=status,
                       comm_seconds=comm))
    [(operator, n, failed, compute, comm, nbytes)] = task_summary(db, "r1")
    assert (operator, n, failed, compute, comm, nbytes) == ("relu", 3, 1, 6.0, 2.0, 3 * big)
    assert all(type(v) is int for v in (n, failed, nbytes))
    assert all(type(v) is float for v in (compute, comm))
    assert measured_ratio(task_summary(db, "r1")) == 3.0


# --- migrations ----------------------------------------------------------------------------

def test_a_version_1_database_is_migrated_with_its_rows(db_url):
    load_sql(db_url, SCHEMA_V1)
    before = snapshot(db_url)
    assert set(before) == V1_TABLES and stored_version(db_url) == 1
    assert len(before["runs"]) == 3 and len(before["tasks"]) == 4

    db = open_db(db_url)

    after = snapshot(db_url)
    added = {"events", "asset_materializations", "asset_check_results",  # versions 2-4
             "schedules", "schedule_ticks", "operator_speeds",  # and 7
             "trainings", "training_metrics", "training_checkpoints",  # and 9
             "operations", "asset_definitions", "served_models"}  # and 14 to 16
    assert stored_version(db_url) == 16 == SCHEMA_VERSION
    assert set(after) == V1_TABLES | added
    assert all(after[t] == [] for t in added)
    assert [r.pop("username") for r in after["runs"]] == ["", "", ""]
    assert [r.pop("training_id") for r in after["runs"]] == [None] * 3  # version 9
    assert [r.pop("pid_space") for r in after["runs"]] == [None] * 3  # version 13
    assert [r.pop("comm_seconds") for r in after["tasks"]] == [None] * 4  # version 6
    assert all(r.pop("memory_usable") is None for r in after["devices"])  # version 11
    assert {t: rows for t, rows in after.items() if t not in added | {"deepx_schema"}} == \
        {t: rows for t, rows in before.items() if t != "deepx_schema"}
    # The migrated schema is the one a new database gets, indexes included.
    assert columns(db_url) == model_columns()
    assert indexes(db_url) == model_indexes()

    # New rows go in, ids continue after the old ones.
    with db.session() as s:
        s.add(new_run("new", "9f2c4e1ab7d35e60", username="bob"))
    with db.session() as s:
        s.add(Task(run_id="new", key="('y@9f2c', 0, 0)", tensor="y@9f2c", operator="relu"))
        s.add(Event(run_id="new", at=1.0, kind="worker-lost", worker="tcp://10.0.0.2:40123"))
    with db.session() as s:
        assert s.get(Run, "new").username == "bob"
        assert s.get(Run, "5b0f6c1e8d2a4f3b9c7e1a0d2b4c6e8f").username == ""
        assert s.exec(select(Task.id).order_by(Task.id)).all() == [1, 2, 3, 4, 5]
        assert s.exec(select(Event.kind)).all() == ["worker-lost"]


def test_placements_are_unique_per_run_once_migrated(db_url):
    """Version 8: a chunk's row is per run. Two runs of one graph compute the same (content)
    keys, and may do it on the same worker: each keeps its own row; one run still has one
    row per chunk and worker."""
    load_sql(db_url, SCHEMA_V1)
    runs = [r["id"] for r in snapshot(db_url)["runs"]]
    placed = snapshot(db_url)["chunk_placements"][0]
    db = open_db(db_url)
    other = next(r for r in runs if r != placed["run_id"])
    same = {k: placed[k] for k in ("tensor", "chunk", "worker", "tier", "state", "updated_at")}
    with db.session() as s:
        s.add(ChunkPlacement(run_id=other, **same))
    with db.read() as s:
        assert sorted(s.exec(select(ChunkPlacement.run_id).where(
            ChunkPlacement.tensor == placed["tensor"], ChunkPlacement.chunk == placed["chunk"],
            ChunkPlacement.worker == placed["worker"])).all()) == sorted([placed["run_id"], other])
        ids = s.exec(select(ChunkPlacement.id).order_by(ChunkPlacement.id)).all()
    assert ids[-1] == max(r["id"] for r in snapshot(db_url)["chunk_placements"][:-1]) + 1
    with pytest.raises(DatabaseError, match="(?i)unique"):
        with db.session() as s:
            s.add(ChunkPlacement(run_id=other, **same))


def _drop_version_9(conn) -> None:
    """Take away what versions 9 and 10 added (the training tables, runs.training_id;
    schedules.stopped_at)."""
    _drop_version_10(conn)
    for table in ("training_checkpoints", "training_metrics", "trainings"):
        conn.execute(text(f"DROP TABLE {table}"))
    conn.execute(text("DROP INDEX ix_runs_training_id"))
    conn.execute(text("ALTER TABLE runs DROP COLUMN training_id"))


def _drop_version_10(conn) -> None:
    _drop_version_11(conn)
    conn.execute(text("ALTER TABLE schedules DROP COLUMN stopped_at"))


def _drop_version_11(conn) -> None:
    _drop_version_12(conn)
    conn.execute(text("ALTER TABLE devices DROP COLUMN memory_usable"))


def _drop_version_12(conn) -> None:
    _drop_version_13(conn)
    conn.execute(text("ALTER TABLE asset_materializations DROP COLUMN manifest_digest"))


def _drop_version_13(conn) -> None:
    _drop_version_14(conn)
    conn.execute(text("ALTER TABLE runs DROP COLUMN pid_space"))


def _drop_version_14(conn) -> None:
    _drop_version_15(conn)
    conn.execute(text("DROP TABLE operations"))


def _drop_version_15(conn) -> None:
    _drop_version_16(conn)
    conn.execute(text("DROP TABLE asset_definitions"))


def _drop_version_16(conn) -> None:
    conn.execute(text("DROP TABLE served_models"))


def _without_version_14(tables: dict) -> None:
    """A snapshot as it was before version 14: its operations table empty, taken away."""
    _without_version_15(tables)
    assert tables.pop("operations") == []


def _without_version_15(tables: dict) -> None:
    """A snapshot as it was before version 15: its asset_definitions table empty, taken
    away."""
    _without_version_16(tables)
    assert tables.pop("asset_definitions") == []


def _without_version_16(tables: dict) -> None:
    """A snapshot as it was before version 16: its served_models table empty, taken away."""
    assert tables.pop("served_models") == []


def _without_version_9(tables: dict) -> None:
    """A snapshot as it was before version 9: its new tables empty, and taken away."""
    for table in ("training_checkpoints", "training_metrics", "trainings"):
        assert tables.pop(table) == []
    assert all(r.pop("training_id") is None for r in tables["runs"])
    assert all(r.pop("stopped_at") is None for r in tables["schedules"])  # version 10
    assert all(r.pop("memory_usable") is None for r in tables["devices"])  # version 11
    assert all(r.pop("pid_space") is None for r in tables["runs"])  # version 13


def test_a_version_4_database_gets_the_listing_indexes_with_its_rows(db_url):
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=3, created_at=1.0))
        s.add(new_run("r1", "abc"))
    with db.session() as s:
        s.add(ChunkPlacement(run_id="r1", tensor="y@abc", chunk="0,1", worker="tcp://w:1",
                             state="stored", nbytes=2**20, updated_at=11.0))
        s.add(ScheduleTick(schedule="hourly", tick_at=3600.0, status="skipped",
                           started_at=3600.5))
    close_all()
    # Back to version 4: today's tables without what versions 5 and 6 added.
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_chunk_placements_state"))
        conn.execute(text("DROP INDEX ix_schedule_ticks_tick_at"))
        conn.execute(text("DROP INDEX ix_asset_materializations_target"))
        conn.execute(text("ALTER TABLE tasks DROP COLUMN comm_seconds"))
        _drop_version_9(conn)
        conn.execute(text("UPDATE deepx_schema SET version = 4"))
    engine.dispose()
    before = snapshot(db_url)
    assert indexes(db_url) != model_indexes()

    open_db(db_url)

    assert stored_version(db_url) == SCHEMA_VERSION
    assert indexes(db_url) == model_indexes()
    after = snapshot(db_url)
    assert after.pop("deepx_schema") == [{"id": 1, "version": SCHEMA_VERSION}]
    before.pop("deepx_schema")
    _without_version_9(after)
    _without_version_14(after)
    assert after == before and len(after["chunk_placements"]) == len(after["schedule_ticks"]) == 1


def test_a_version_5_database_gets_comm_seconds_and_the_target_index(db_url):
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=3, created_at=1.0))
        s.add(new_run("r1", "abc"))
    with db.session() as s:
        s.add(Task(run_id="r1", key="('y@abc', 0)", tensor="y@abc", operator="relu",
                   start=1.0, stop=2.0))
    close_all()
    # Back to version 5: today's tables without what version 6 added.
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_asset_materializations_target"))
        conn.execute(text("ALTER TABLE tasks DROP COLUMN comm_seconds"))
        _drop_version_9(conn)
        conn.execute(text("UPDATE deepx_schema SET version = 5"))
    engine.dispose()
    before = snapshot(db_url)
    assert "comm_seconds" not in before["tasks"][0]

    db = open_db(db_url)

    assert stored_version(db_url) == SCHEMA_VERSION
    assert columns(db_url) == model_columns()
    assert indexes(db_url) == model_indexes()
    after = snapshot(db_url)
    assert [r.pop("comm_seconds") for r in after["tasks"]] == [None]
    after.pop("deepx_schema")
    before.pop("deepx_schema")
    _without_version_9(after)
    _without_version_14(after)
    assert after == before
    with db.session() as s:  # and new rows carry it
        s.add(Task(run_id="r1", key="('y@abc', 1)", tensor="y@abc", operator="relu",
                   comm_seconds=0.25))
    with db.read() as s:
        assert s.exec(select(Task.comm_seconds).order_by(Task.id)).all() == [None, 0.25]


def test_a_version_6_database_gets_the_operator_speeds_table(db_url):
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="abc", yaml="deepx: 1\n", n_nodes=3, created_at=1.0))
        s.add(new_run("r1", "abc"))
    close_all()
    engine = raw_engine(db_url)  # back to version 6: without what version 7 added
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE operator_speeds"))
        _drop_version_9(conn)
        conn.execute(text("UPDATE deepx_schema SET version = 6"))
    engine.dispose()
    before = snapshot(db_url)
    assert "operator_speeds" not in before

    db = open_db(db_url)

    assert stored_version(db_url) == SCHEMA_VERSION
    assert columns(db_url) == model_columns()
    assert indexes(db_url) == model_indexes()
    after = snapshot(db_url)
    assert after.pop("operator_speeds") == []
    after.pop("deepx_schema")
    before.pop("deepx_schema")
    _without_version_9(after)
    _without_version_14(after)
    assert after == before
    with db.session() as s:  # and takes rows
        s.add(OperatorSpeed(operator="relu", host="h", worker="0", flops=1.0, bytes=2.0,
                            seconds=0.5, tasks=1, updated_at=3.0))
    with db.read() as s:
        assert s.exec(select(OperatorSpeed.tasks)).all() == [1]


def back_to(db_url: str, version: int, drop) -> dict:
    """Turn the database back to `version` (`drop` takes away what later versions added);
    its snapshot, without the version row."""
    close_all()
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        drop(conn)
        conn.execute(text("UPDATE deepx_schema SET version = :v"), {"v": version})
    engine.dispose()
    before = snapshot(db_url)
    before.pop("deepx_schema")
    return before


def migrated(db_url: str):
    """Open the database (which migrates it); check it has the current schema, indexes
    included; return it and its snapshot, without the version row."""
    db = open_db(db_url)
    assert stored_version(db_url) == SCHEMA_VERSION
    assert columns(db_url) == model_columns()
    assert indexes(db_url) == model_indexes()
    after = snapshot(db_url)
    after.pop("deepx_schema")
    return db, after


def test_a_version_9_database_gets_schedules_stopped_at(db_url):
    db = open_db(db_url)
    with db.session() as s:
        s.add(Schedule(name="hourly", cron="0 * * * *", selection="x", daemon="h:1",
                       heartbeat_at=5.0, updated_at=1.0))
    before = back_to(db_url, 9, _drop_version_10)
    assert "stopped_at" not in before["schedules"][0]

    db, after = migrated(db_url)

    assert [r.pop("stopped_at") for r in after["schedules"]] == [None]
    _without_version_14(after)
    assert all(r.pop("memory_usable") is None for r in after["devices"])  # version 11 too
    assert after == before
    with db.session() as s:  # and a stop is recorded
        s.get(Schedule, "hourly").stopped_at = 7.0
    with db.read() as s:
        assert s.get(Schedule, "hourly").stopped_at == 7.0


def test_a_version_10_database_gets_devices_usable_memory(db_url):
    db = open_db(db_url)
    with db.session() as s:
        s.add(Worker(scheduler="ucx://s:8786", address="ucx://w:1", name="gpu0", host="h",
                     protocol="ucx", nthreads=1, first_seen=1.0, last_seen=2.0))
    with db.session() as s:
        worker_id = s.exec(select(Worker.id)).one()
        s.add(Device(worker_id=worker_id, name="NVIDIA H100 80GB HBM3",
                     memory_total=80 * 2**30, memory_free=79 * 2**30, registered_at=2.0))
    before = back_to(db_url, 10, _drop_version_11)
    assert "memory_usable" not in before["devices"][0]

    db, after = migrated(db_url)

    assert [r.pop("memory_usable") for r in after["devices"]] == [None]
    _without_version_14(after)
    assert after == before
    with db.session() as s:  # and the usable memory is recorded
        s.exec(select(Device)).one().memory_usable = 77 * 2**30
    with db.read() as s:
        assert s.exec(select(Device)).one().memory_usable == 77 * 2**30


def test_a_version_11_database_gets_the_manifest_digest(db_url):
    db = open_db(db_url)
    with db.session() as s:
        s.add(AssetMaterialization(version="0123abcd", asset="features", shape="[4, 2]",
                                   dtype="float32", storage="zarr", uri="/data/v.zarr",
                                   created_at=1.0))
    before = back_to(db_url, 11, _drop_version_12)
    assert "manifest_digest" not in before["asset_materializations"][0]

    db, after = migrated(db_url)

    assert [r.pop("manifest_digest") for r in after["asset_materializations"]] == [None]
    _without_version_14(after)
    assert after == before
    with db.session() as s:  # and a digest is recorded
        s.exec(select(AssetMaterialization)).one().manifest_digest = "9f" * 16
    with db.read() as s:
        assert s.exec(select(AssetMaterialization)).one().manifest_digest == "9f" * 16


def test_a_version_12_database_gets_the_runs_pid_space(db_url):
    """Version 13: a run records its driver's PID space; the runs before it record none, so
    no process looks their drivers up by pid (meta/orphans.py)."""
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="g1", yaml="nodes: []", n_nodes=0, created_at=1.0))
        s.add(new_run("r1", "g1", pid_space="boot/4:4026531836"))
    before = back_to(db_url, 12, _drop_version_13)
    assert "pid_space" not in before["runs"][0]

    db, after = migrated(db_url)

    assert [r.pop("pid_space") for r in after["runs"]] == [None]
    _without_version_14(after)
    assert after == before
    with db.session() as s:  # and a space is recorded
        s.add(new_run("r2", "g1", pid_space="boot/4:4026531836"))
    with db.read() as s:
        assert s.get(Run, "r2").pid_space == "boot/4:4026531836"
        assert s.get(Run, "r1").pid_space is None


def test_a_version_13_database_gets_the_operations_table(db_url):
    """Version 14: the gateway's operations; the rows before it are kept as they were."""
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="g1", yaml="nodes: []", n_nodes=0, created_at=1.0))
        s.add(new_run("r1", "g1", pid_space="boot/4:4026531836"))
    before = back_to(db_url, 13, _drop_version_14)
    assert "operations" not in before

    db, after = migrated(db_url)

    _without_version_14(after)
    assert after == before
    with db.session() as s:  # and an operation is recorded
        s.add(Operation(id="op1", kind="execute", request_digest="ab" * 32, created_at=2.0,
                        run_id="r1", host="here", pid=1))
    with db.read() as s:
        assert s.get(Operation, "op1").state == "running"


def test_a_version_14_database_gets_the_asset_definitions_table(db_url):
    """Version 15: assets defined through the contract; the rows before it are kept."""
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="g1", yaml="nodes: []", n_nodes=0, created_at=1.0))
        s.add(Operation(id="op1", kind="execute", request_digest="ab" * 32, created_at=2.0,
                        host="here", pid=1))
    before = back_to(db_url, 14, _drop_version_15)
    assert "asset_definitions" not in before and len(before["operations"]) == 1

    db, after = migrated(db_url)

    _without_version_15(after)
    assert after == before
    with db.session() as s:  # and a definition is recorded
        s.add(AssetDefinition(name="doubled", spec='{"nodes": []}', dependencies="[]",
                              checks="[]", code_version="c0", defined_at=3.0))
    with db.read() as s:
        assert s.get(AssetDefinition, "doubled").partitions is None


def test_a_version_15_database_gets_the_served_models_table(db_url):
    """Version 16: the models gateways serve; the rows before it are kept."""
    db = open_db(db_url)
    with db.session() as s:
        s.add(AssetDefinition(name="doubled", spec='{"nodes": []}', dependencies="[]",
                              checks="[]", code_version="c0", defined_at=3.0))
    before = back_to(db_url, 15, _drop_version_16)
    assert "served_models" not in before and len(before["asset_definitions"]) == 1

    db, after = migrated(db_url)

    _without_version_16(after)
    assert after == before
    with db.session() as s:  # and a served model is recorded
        s.add(ServedModelRecord(gateway="h:1", model="mlp", state="READY", updated_at=4.0))
    with db.read() as s:
        assert s.get(ServedModelRecord, ("h:1", "mlp")).requests == 0


@pytest.mark.parametrize("stamped", [1, 5, SCHEMA_VERSION - 1])
def test_a_version_row_set_back_is_migrated_to_the_tables_it_has(db_url, stamped):
    """A database whose version row says less than its tables hold (an older copy of the
    row put back, a version set by hand) is brought to this version with its rows: each
    step adds only what is missing, where it failed with 'duplicate column name'."""
    db = open_db(db_url)
    with db.session() as s:
        s.add(GraphRecord(hash="g1", yaml="nodes: []", n_nodes=0, created_at=1.0))
        s.add(new_run("r1", "g1"))
    with db.session() as s:
        s.add(Task(run_id="r1", key="('x', 0)", tensor="x", operator="add", comm_seconds=0.5))
        s.add(AssetMaterialization(version="0123abcd", asset="features", shape="[4]",
                                   dtype="float32", storage="zarr", uri="/data/v.zarr",
                                   manifest_digest="9f" * 16, created_at=1.0))
    before = back_to(db_url, stamped, lambda conn: None)

    db, after = migrated(db_url)

    assert after == before
    with db.read() as s:
        assert s.exec(select(Task.comm_seconds)).all() == [0.5]


def test_a_newer_schema_is_refused_and_left_alone(db_url):
    open_db(db_url)
    close_all()
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE deepx_schema SET version = :v"), {"v": SCHEMA_VERSION + 1})
    engine.dispose()
    before = snapshot(db_url)

    with pytest.raises(DatabaseError) as err:
        open_db(db_url)

    message = str(err.value)
    assert "newer" in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert f"({SCHEMA_VERSION})" in message
    assert snapshot(db_url) == before


def test_tables_without_a_schema_version_are_refused(db_url):
    engine = raw_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE runs (id VARCHAR NOT NULL PRIMARY KEY, note TEXT)")
        conn.exec_driver_sql("CREATE TABLE tasks (id INTEGER NOT NULL PRIMARY KEY)")
    engine.dispose()

    with pytest.raises(DatabaseError, match=r"\(runs, tasks\) but no schema version"):
        open_db(db_url)

    assert set(columns(db_url)) == {"runs", "tasks"}  # nothing created beside them


# --- URLs that cannot be opened ------------------------------------------------------------

@pytest.mark.parametrize("url, says", [
    ("not a url", "'not a url' is not a SQLAlchemy URL"),
    ("nosuchdialect://x", "nosuchdialect"),
])
def test_a_bad_url_is_a_database_error(url, says):
    with pytest.raises(DatabaseError) as err:
        open_db(url)
    assert says in str(err.value)


def test_a_missing_driver_hides_the_password():
    with pytest.raises(DatabaseError) as err:
        open_db("postgresql+nosuchdriver://deepx:s3cret@127.0.0.1/deepx")
    assert "postgresql+nosuchdriver://deepx:***@127.0.0.1/deepx" in str(err.value)
    assert "s3cret" not in str(err.value)


def test_an_unreachable_postgresql_names_the_url_without_its_password():
    port = free_port()
    with pytest.raises(DatabaseError) as err:
        open_db(f"postgresql+psycopg://deepx:s3cret@127.0.0.1:{port}/deepx")
    message = str(err.value)
    assert f"postgresql+psycopg://deepx:***@127.0.0.1:{port}/deepx" in message
    assert "s3cret" not in message


def test_a_file_that_is_not_sqlite_is_a_database_error(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are not the tables you are looking for\n" * 100)
    with pytest.raises(DatabaseError, match="cannot open the metadata database"):
        open_db(f"sqlite:///{path.as_posix()}")


# --- where the database is -----------------------------------------------------------------

def test_database_url_explicit_then_environment_then_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEEPX_DB_URL", "sqlite:///from-env.db")
    assert database_url("sqlite:///explicit.db") == "sqlite:///explicit.db"
    assert database_url() == "sqlite:///from-env.db"

    monkeypatch.delenv("DEEPX_DB_URL")
    default = f"sqlite:///{(tmp_path / '.deepx' / 'deepx.db').as_posix()}"
    assert database_url() == default
    monkeypatch.setenv("DEEPX_DB_URL", "")  # empty means unset
    assert database_url() == default

    open_db()
    close_all()
    assert (tmp_path / ".deepx" / "deepx.db").is_file()


# --- many writers --------------------------------------------------------------------------

PROCESSES = 4
ROWS = 200


def _write_runs(url: str, worker: int, start, results) -> None:
    """In a child process: wait for the others, then write ROWS runs and tasks, one short
    transaction each. Reports None, or the traceback."""
    try:
        start.wait()
        db = open_db(url)  # the first open creates the schema: the processes race on it too
        with db.session() as s:
            s.add(GraphRecord(hash=f"g{worker}", n_nodes=1, created_at=time.time()))
        for i in range(ROWS):
            with db.session() as s:
                s.add(new_run(f"{worker}-{i}", f"g{worker}", pid=worker))
            with db.session() as s:
                s.add(Task(run_id=f"{worker}-{i}", key=f"('t@g{worker}', {i})",
                           tensor=f"t@g{worker}", operator="relu", start=time.time()))
            with db.session() as s:
                s.get(Run, f"{worker}-{i}").status = "succeeded"
        results.put(None)
    except BaseException:
        results.put(traceback.format_exc())


@pytest.mark.slow
def test_processes_writing_at_once_lose_nothing(db_url):
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_write_runs, args=(db_url, w, start, results))
             for w in range(PROCESSES)]
    for p in procs:
        p.start()
    errors = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert errors == [None] * PROCESSES

    with open_db(db_url).session() as s:
        runs = s.exec(select(Run.id, Run.status)).all()
        tasks = s.exec(select(Task.run_id)).all()
    expected = {f"{w}-{i}" for w in range(PROCESSES) for i in range(ROWS)}
    assert {r.id for r in runs} == expected and len(runs) == len(expected)
    assert {r.status for r in runs} == {"succeeded"}
    assert sorted(tasks) == sorted(expected)
