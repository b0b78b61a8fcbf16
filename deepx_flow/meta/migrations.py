"""Schema versions of the metadata database, and the steps between them.

A new database gets the current tables (`models.py`) and is stamped `SCHEMA_VERSION`. An
older one is brought forward by the steps after its version, in order, in one transaction;
its rows stay. A database stamped with a version newer than this code fails to open with a
message saying so: old code must not write into a schema it does not know. Nor does it
later: every transaction reads the version again (`check_transaction`), so a process that
opened the database stops when another one upgrades it. A damaged version row (none, two, a
version below 1) is refused as it is, never migrated.

To change a table: edit `models.py`, add a step here that turns the previous schema into
the new one (portable DDL: it runs on SQLite and PostgreSQL), and bump `SCHEMA_VERSION`.

History:
1. workers, devices, storage_tiers, operators, links, graphs, runs, tasks, chunk_placements.
2. events (drift, worker loss, ... per run); runs.username (who started the run).
3. asset_materializations, asset_check_results.
4. schedules, schedule_ticks.
5. indexes for the dashboard's listings: chunk_placements (state), schedule_ticks (tick_at).
6. tasks.comm_seconds (time spent fetching inputs); an index on asset_materializations
   (asset, partition, created_at) for the newest version of every asset and partition.
7. operator_speeds (measured speed of each operator on each worker).
8. chunk_placements unique per run: (run_id, tensor, chunk, worker) instead of (tensor, chunk,
   worker), so a later run that computes the same chunk on the same worker adds its own row.
9. trainings, training_metrics, training_checkpoints; runs.training_id.
10. schedules.stopped_at (a daemon stopped cleanly says so, instead of looking alive until
    its heartbeat goes stale).
11. devices.memory_usable (a GPU's memory less what other processes and its CUDA context
    hold: what the planner budgets).
12. asset_materializations.manifest_digest (the digest of a stored version's manifest,
    which binds its metadata and each chunk to its position).
13. runs.pid_space (the driver's boot id and PID namespace: a run's pid is looked up only
    from a process that shares them, not from any of the same host name).
14. operations (the gateway's executions and materializations, which clients ask for again
    by id).
15. asset_definitions (assets defined by a graph spec through the gateway's contract).
16. served_models (the models each gateway serves, with their request counts).

Every step can run on a database that already has what it adds (columns are added, tables
and indexes created, only where missing): a database whose version row says less than its
tables hold (an older copy of the row put back, a version set by hand) is brought to this
version, not refused with a duplicate column.
"""

from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, Column, Float, ForeignKey, Index, Integer,
                        MetaData, String, Table, Text, UniqueConstraint, inspect, text, update)
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from deepx_flow.errors import DatabaseError
from deepx_flow.meta.models import SchemaInfo

SCHEMA_VERSION = 16

# An arbitrary constant: PostgreSQL sessions migrating at once take turns on this lock.
_PG_LOCK_ID = 74_700_11


def _add_column(conn: Connection, table: str, column: str, sql_type: str) -> None:
    """ALTER TABLE ADD COLUMN, unless the table has the column already."""
    if column not in {c["name"] for c in inspect(conn).get_columns(table)}:
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))


def _v2_events_and_username(conn: Connection) -> None:
    # The events table as it was at version 2, frozen here: a later change to the model
    # must come as its own step, or migrating a version-1 database would skip it.
    frozen = MetaData()
    Table("runs", frozen, Column("id", String, primary_key=True))  # for the foreign key
    events = Table(
        "events", frozen,
        Column("id", Integer, primary_key=True),
        Column("run_id", String, ForeignKey("runs.id"), nullable=True, index=True),
        Column("at", Float, nullable=False),
        Column("kind", String, nullable=False),
        Column("worker", String, nullable=True),
        Column("key", String, nullable=True),
        Column("message", Text, nullable=True))
    events.create(conn, checkfirst=True)
    _add_column(conn, "runs", "username", "VARCHAR NOT NULL DEFAULT ''")


def _v3_assets(conn: Connection) -> None:
    # The asset tables as they were at version 3 (frozen, as in step 2).
    frozen = MetaData()
    Table("runs", frozen, Column("id", String, primary_key=True))
    materializations = Table(
        "asset_materializations", frozen,
        Column("id", Integer, primary_key=True),
        Column("version", String, nullable=False, unique=True),
        Column("asset", String, nullable=False),
        Column("partition", String, nullable=True),
        Column("code_version", String, nullable=True),
        Column("upstream_versions", Text, nullable=True),
        Column("shape", String, nullable=False),
        Column("dtype", String, nullable=False),
        Column("chunks", String, nullable=True),
        Column("nbytes", BigInteger, nullable=True),
        Column("storage", String, nullable=False),
        Column("uri", Text, nullable=True),
        Column("run_id", String, ForeignKey("runs.id"), nullable=True),
        Column("seconds", Float, nullable=True),
        Column("checks_passed", Boolean, nullable=True),
        Column("created_at", Float, nullable=False),
        Index("ix_asset_materializations_asset", "asset", "created_at"))
    checks = Table(
        "asset_check_results", frozen,
        Column("id", Integer, primary_key=True),
        Column("materialization_id", Integer, ForeignKey("asset_materializations.id"),
               nullable=False, index=True),
        Column("check", String, nullable=False),
        Column("passed", Boolean, nullable=False),
        Column("blocking", Boolean, nullable=False),
        Column("value", Float, nullable=True),
        Column("message", Text, nullable=True),
        Column("created_at", Float, nullable=False))
    materializations.create(conn, checkfirst=True)
    checks.create(conn, checkfirst=True)


def _v4_schedules(conn: Connection) -> None:
    # The schedule tables as they were at version 4 (frozen, as in step 2).
    frozen = MetaData()
    Table("schedules", frozen,
          Column("name", String, primary_key=True),
          Column("cron", String, nullable=False),
          Column("selection", String, nullable=False),
          Column("timezone", String, nullable=False),
          Column("definitions", String, nullable=True),
          Column("daemon", String, nullable=True),
          Column("heartbeat_at", Float, nullable=True),
          Column("updated_at", Float, nullable=False))
    Table("schedule_ticks", frozen,
          Column("id", Integer, primary_key=True),
          Column("schedule", String, nullable=False, index=True),
          Column("tick_at", Float, nullable=False),
          Column("status", String, nullable=False),
          Column("run_id", String, nullable=True),
          Column("message", Text, nullable=True),
          Column("daemon", String, nullable=True),
          Column("started_at", Float, nullable=False),
          Column("finished_at", Float, nullable=True),
          UniqueConstraint("schedule", "tick_at"))
    frozen.create_all(conn, checkfirst=True)


def _v5_listing_indexes(conn: Connection) -> None:
    # With 10,000 runs on record, the registry's bytes per storage tier read only the held
    # placements, and the schedules page's newest ticks come without sorting every tick.
    frozen = MetaData()
    placements = Table("chunk_placements", frozen, Column("state", String))
    ticks = Table("schedule_ticks", frozen, Column("tick_at", Float))
    Index("ix_chunk_placements_state", placements.c.state).create(conn, checkfirst=True)
    Index("ix_schedule_ticks_tick_at", ticks.c.tick_at).create(conn, checkfirst=True)


def _v6_comm_seconds(conn: Connection) -> None:
    # The run page's measured compute/communication ratio, and the graph page's lineage
    # (the newest version per asset and partition) without a scan of every version.
    _add_column(conn, "tasks", "comm_seconds", "FLOAT")
    frozen = MetaData()
    versions = Table("asset_materializations", frozen, Column("asset", String),
                     Column("partition", String), Column("created_at", Float))
    Index("ix_asset_materializations_target", versions.c.asset, versions.c.partition,
          versions.c.created_at).create(conn, checkfirst=True)


def _v7_operator_speeds(conn: Connection) -> None:
    # The table as it was at version 7 (frozen, as in step 2).
    frozen = MetaData()
    Table("operator_speeds", frozen,
          Column("id", Integer, primary_key=True),
          Column("operator", String, nullable=False),
          Column("host", String, nullable=False),
          Column("worker", String, nullable=False),
          Column("flops", Float, nullable=False),
          Column("bytes", Float, nullable=False),
          Column("seconds", Float, nullable=False),
          Column("tasks", Integer, nullable=False),
          Column("updated_at", Float, nullable=False),
          UniqueConstraint("operator", "host", "worker"))
    frozen.create_all(conn, checkfirst=True)


def _v8_placements_per_run(conn: Connection) -> None:
    # Keys are content hashes: two runs of one graph compute the same keys, and with one row
    # per (tensor, chunk, worker) the second run took the first one's rows over.
    if conn.dialect.name == "postgresql":
        per_run = False
        for unique in inspect(conn).get_unique_constraints("chunk_placements"):
            if unique["column_names"] == ["tensor", "chunk", "worker"]:
                conn.execute(text(f'ALTER TABLE chunk_placements DROP CONSTRAINT '
                                  f'"{unique["name"]}"'))
            per_run |= unique["column_names"] == ["run_id", "tensor", "chunk", "worker"]
        if not per_run:
            conn.execute(text("ALTER TABLE chunk_placements ADD CONSTRAINT "
                              "chunk_placements_run_id_tensor_chunk_worker_key "
                              "UNIQUE (run_id, tensor, chunk, worker)"))
        return
    if any(unique["column_names"] == ["run_id", "tensor", "chunk", "worker"]
           for unique in inspect(conn).get_unique_constraints("chunk_placements")):
        return  # unique per run already
    # SQLite cannot change a table's constraints: the table is made anew and its rows copied
    # (SQLite's documented way), as it was at version 8 (frozen, as in step 2).
    frozen = MetaData()
    Table("runs", frozen, Column("id", String, primary_key=True))
    columns = [Column("id", Integer, primary_key=True),
               Column("run_id", String, ForeignKey("runs.id"), nullable=False),
               Column("tensor", String, nullable=False),
               Column("chunk", String, nullable=False),
               Column("worker", String, nullable=False),
               Column("device", String, nullable=True),
               Column("tier", String, nullable=False),
               Column("nbytes", BigInteger, nullable=True),
               Column("state", String, nullable=False),
               Column("updated_at", Float, nullable=False)]
    Table("chunk_placements_v8", frozen, *columns,
          UniqueConstraint("run_id", "tensor", "chunk", "worker")).create(conn)
    names = ", ".join(c.name for c in columns)
    conn.execute(text(f"INSERT INTO chunk_placements_v8 ({names}) "
                      f"SELECT {names} FROM chunk_placements"))
    conn.execute(text("DROP TABLE chunk_placements"))
    conn.execute(text("ALTER TABLE chunk_placements_v8 RENAME TO chunk_placements"))
    renamed = Table("chunk_placements", MetaData(), Column("run_id", String),
                    Column("state", String))
    Index("ix_chunk_placements_run", renamed.c.run_id).create(conn)
    Index("ix_chunk_placements_state", renamed.c.state).create(conn)


def _v9_trainings(conn: Connection) -> None:
    # The tables as they were at version 9 (frozen, as in step 2).
    frozen = MetaData()
    Table("runs", frozen, Column("id", String, primary_key=True))
    Table("trainings", frozen,
          Column("id", String, primary_key=True),
          Column("status", String, nullable=False, index=True),
          Column("started_at", Float, nullable=False, index=True),
          Column("ended_at", Float, nullable=True),
          Column("asset", String, nullable=True, index=True),
          Column("config_hash", String, nullable=False),
          Column("optimizer", String, nullable=False),
          Column("seed", Integer, nullable=False),
          Column("batch_size", Integer, nullable=False),
          Column("epochs", Integer, nullable=False),
          Column("steps", Integer, nullable=False),
          Column("steps_done", Integer, nullable=False),
          Column("resumed_from", String, nullable=True),
          Column("error", Text, nullable=True),
          Column("host", String, nullable=False),
          Column("pid", Integer, nullable=False))
    Table("training_metrics", frozen,
          Column("id", Integer, primary_key=True),
          Column("training_id", String, ForeignKey("trainings.id"), nullable=False),
          Column("step", Integer, nullable=False),
          Column("epoch", Integer, nullable=False),
          Column("name", String, nullable=False),
          Column("value", Float, nullable=False),
          Column("at", Float, nullable=False),
          Index("ix_training_metrics_training", "training_id", "name", "step"))
    Table("training_checkpoints", frozen,
          Column("id", Integer, primary_key=True),
          Column("training_id", String, ForeignKey("trainings.id"), nullable=False,
                 index=True),
          Column("asset", String, nullable=False, index=True),
          Column("version", String, nullable=False),
          Column("step", Integer, nullable=False),
          Column("epoch", Integer, nullable=False),
          Column("config_hash", String, nullable=False, index=True),
          Column("layout", Text, nullable=True),
          Column("created_at", Float, nullable=False))
    frozen.create_all(conn, checkfirst=True)
    _add_column(conn, "runs", "training_id", "VARCHAR")
    Index("ix_runs_training_id", Table("runs", MetaData(), Column("training_id", String))
          .c.training_id).create(conn, checkfirst=True)


def _v10_schedule_stopped_at(conn: Connection) -> None:
    _add_column(conn, "schedules", "stopped_at", "FLOAT")


def _v11_device_usable(conn: Connection) -> None:
    _add_column(conn, "devices", "memory_usable", "BIGINT")


def _v12_manifest_digest(conn: Connection) -> None:
    _add_column(conn, "asset_materializations", "manifest_digest", "VARCHAR")


def _v13_runs_pid_space(conn: Connection) -> None:
    _add_column(conn, "runs", "pid_space", "VARCHAR")


def _v14_operations(conn: Connection) -> None:
    # The table as it was at version 14 (frozen, as in step 2).
    frozen = MetaData()
    Table("operations", frozen,
          Column("id", String, primary_key=True),
          Column("kind", String, nullable=False),
          Column("state", String, nullable=False, index=True),
          Column("request_digest", String, nullable=False),
          Column("target", String, nullable=True),
          Column("created_at", Float, nullable=False, index=True),
          Column("ended_at", Float, nullable=True),
          Column("run_id", String, nullable=True, index=True),
          Column("outputs", Text, nullable=True),
          Column("error", Text, nullable=True),
          Column("host", String, nullable=False),
          Column("pid", Integer, nullable=False),
          Column("pid_space", String, nullable=True),
          Column("heartbeat_at", Float, nullable=True))
    frozen.create_all(conn, checkfirst=True)


def _v15_asset_definitions(conn: Connection) -> None:
    # The table as it was at version 15 (frozen, as in step 2).
    frozen = MetaData()
    Table("asset_definitions", frozen,
          Column("name", String, primary_key=True),
          Column("spec", Text, nullable=False),
          Column("dependencies", Text, nullable=False),
          Column("description", Text, nullable=True),
          Column("partitions", Text, nullable=True),
          Column("checks", Text, nullable=False),
          Column("code_version", String, nullable=False),
          Column("defined_at", Float, nullable=False))
    frozen.create_all(conn, checkfirst=True)


def _v16_served_models(conn: Connection) -> None:
    # The table as it was at version 16 (frozen, as in step 2).
    frozen = MetaData()
    Table("served_models", frozen,
          Column("gateway", String, primary_key=True),
          Column("model", String, primary_key=True),
          Column("version", String, nullable=True),
          Column("digest", String, nullable=True),
          Column("state", String, nullable=False),
          Column("reason", Text, nullable=True),
          Column("replicas", Text, nullable=True),
          Column("requests", Integer, nullable=False),
          Column("failures", Integer, nullable=False),
          Column("rows", Integer, nullable=False),
          Column("executions", Integer, nullable=False),
          Column("latency_seconds", Float, nullable=False),
          Column("requests_per_second", Float, nullable=False),
          Column("updated_at", Float, nullable=False, index=True))
    frozen.create_all(conn, checkfirst=True)


STEPS = {
    2: _v2_events_and_username,
    3: _v3_assets,
    4: _v4_schedules,
    5: _v5_listing_indexes,
    6: _v6_comm_seconds,
    7: _v7_operator_speeds,
    8: _v8_placements_per_run,
    9: _v9_trainings,
    10: _v10_schedule_stopped_at,
    11: _v11_device_usable,
    12: _v12_manifest_digest,
    13: _v13_runs_pid_space,
    14: _v14_operations,
    15: _v15_asset_definitions,
    16: _v16_served_models,
}


def migrate(engine: Engine) -> int:
    """Create or upgrade the schema; return the version found before (0 for a new one)."""
    shown = engine.url.render_as_string(hide_password=True)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
        tables = set(inspect(conn).get_table_names())
        if SchemaInfo.__tablename__ not in tables:
            ours = sorted(tables & set(SQLModel.metadata.tables))
            if ours:
                raise DatabaseError(f"the database has tables named like deepx_flow's "
                                    f"({', '.join(ours)}) but no schema version; it was "
                                    f"not made by deepx_flow")
            SQLModel.metadata.create_all(conn)
            conn.execute(SchemaInfo.__table__.insert().values(id=1, version=SCHEMA_VERSION))
            return 0
        found = stored_version(conn, shown)
        if found > SCHEMA_VERSION:
            raise DatabaseError(
                f"the metadata database {shown} has schema version {found}, newer than this "
                f"deepx_flow knows ({SCHEMA_VERSION}); upgrade deepx_flow, or use another "
                f"database (--db or DEEPX_DB_URL)")
        for version in range(found + 1, SCHEMA_VERSION + 1):
            STEPS[version](conn)
            conn.execute(update(SchemaInfo).values(version=version))
        return found


def stored_version(conn: Connection, shown: str) -> int:
    """The version `deepx_schema` holds, from its one row. A missing row, a second row or a
    version no deepx_flow wrote (below 1) is damage: the tables cannot be known from it, so
    migrating (which picks steps by it) or writing could only make things worse."""
    rows = conn.exec_driver_sql(f"SELECT id, version FROM {SchemaInfo.__tablename__}").all()
    if len(rows) == 1:
        row_id, version = rows[0]
        if row_id == 1 and isinstance(version, int) and not isinstance(version, bool) \
                and version >= 1:
            return version
        what = f"version {version!r}" if row_id == 1 else f"one row with id {row_id!r}"
    else:
        what = f"{len(rows)} rows" if rows else "no row"
    raise DatabaseError(
        f"the metadata database {shown} has a damaged schema version ({what} in table "
        f"{SchemaInfo.__tablename__}, which holds one row with id 1 and a version from 1 up): "
        f"deepx_flow neither migrates nor writes it; restore it from a backup, or start "
        f"afresh with a new database (--db or DEEPX_DB_URL)")


def check_transaction(conn: Connection, shown: str, write: bool) -> None:
    """Refuse a transaction on a database that is not at SCHEMA_VERSION any more.

    A process migrates a database once, when it opens it, but may use it for days: each
    transaction (`db.py` calls this as it begins) reads the version again, so a process
    stops as soon as another one has upgraded the schema (or an older copy has replaced the
    file), instead of writing rows shaped for a schema that is gone. One small read per
    transaction. On PostgreSQL a write transaction also holds the migration lock shared,
    so a migration waits for the writes in flight and the writes after it see its version;
    on SQLite, BEGIN IMMEDIATE already puts writes and migrations in one queue.
    """
    if write and conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock_shared({_PG_LOCK_ID})")
    found = stored_version(conn, shown)
    if found > SCHEMA_VERSION:
        raise DatabaseError(
            f"the metadata database {shown} is now at schema version {found}: another "
            f"process upgraded it after this one opened it at version {SCHEMA_VERSION}, and "
            f"this deepx_flow does not use a schema it does not know; upgrade deepx_flow and "
            f"start this process again")
    if found < SCHEMA_VERSION:
        raise DatabaseError(
            f"the metadata database {shown} is now at schema version {found}, older than "
            f"the version {SCHEMA_VERSION} this process opened it at (was it replaced by an "
            f"older copy?); start this process again to migrate it")
