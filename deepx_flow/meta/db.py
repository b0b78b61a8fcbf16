"""Opening the metadata database: URL, engine settings, sessions.

SQLite (the default, `.deepx/deepx.db` in the working directory) is set up for several
processes writing at once: WAL journal (readers never wait for a writer), a 60 s busy
timeout, and `BEGIN IMMEDIATE` for every write transaction, so a transaction that will write
takes the write lock up front (a deferred one that upgrades later can fail with "database is
locked" without waiting); reads (`Database.read`) begin deferred and never wait for a
writer. Transactions are kept short by their callers.

Any other SQLAlchemy URL works through `DEEPX_DB_URL` or `--db` (PostgreSQL is tested:
`postgresql+psycopg://user@127.0.0.1:5432/deepx`).

Every transaction begins by checking the schema version (`migrations.check_transaction`), so
a process never writes into a schema another process has changed since it opened it. A
SQLite file of 0 bytes is refused: it is what is left of a database whose history was lost
(truncated, or replaced by an empty file), and creating tables in it would hide that and
orphan the stored asset versions. New files are therefore made whole, never seen empty.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.exc import DatabaseError as SQLAlchemyDatabaseError
from sqlmodel import Session

from deepx_flow.config import settings
from deepx_flow.errors import DatabaseError
from deepx_flow.meta.migrations import check_transaction, migrate

DEFAULT_PATH = Path(".deepx") / "deepx.db"
SQLITE_BUSY_TIMEOUT_S = 60


def database_url(url: str | None = None) -> str:
    """`url`, else `DEEPX_DB_URL`, else the SQLite file under `.deepx/` here."""
    url = url or settings().db_url
    if url:
        return url
    return f"sqlite:///{(Path.cwd() / DEFAULT_PATH).as_posix()}"


class Database:
    """An engine on one metadata database, migrated to this code's schema on opening."""

    def __init__(self, url: str):
        self.url = url
        self.engine = _engine(url)
        try:
            # The only transaction that may find another schema version: it sets it.
            migrate(self.engine.execution_options(deepx_migrating=True))
        except BaseException as err:
            self.engine.dispose()  # a database we refuse keeps no connections open
            if not isinstance(err, SQLAlchemyDatabaseError):
                raise
            # No server, a file that is not SQLite, no permission to create tables, ...
            reason = (str(err.orig).strip().splitlines() or [type(err.orig).__name__])[0]
            raise DatabaseError(f"cannot open the metadata database {self.display_url}: "
                                f"{reason}") from None

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @cached_property
    def identity(self) -> str:
        """This database as processes on several hosts can compare it: its URL (a password
        hidden), and for a SQLite file this host and the file's absolute path (the same path
        on two hosts is two files). Two processes that give the same identity write the
        same database."""
        parsed = make_url(self.url)
        path = _sqlite_path(parsed) if self.is_sqlite else None
        if path is None:
            return parsed.render_as_string(hide_password=True)
        parsed = parsed.set(database=str(path.resolve()))
        return f"{socket.gethostname()} {parsed.render_as_string(hide_password=True)}"

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def session(self):
        """An ORM session in one write transaction, committed on leaving (rolled back on
        error)."""
        with _database_errors(self), Session(self.engine, expire_on_commit=False) as session, \
                session.begin():
            yield session

    @contextmanager
    def read(self):
        """An ORM session for reading: on SQLite a deferred transaction, so readers never
        queue behind the writers' BEGIN IMMEDIATE (WAL lets them read during a write)."""
        engine = self.engine.execution_options(deepx_read_only=True)
        with _database_errors(self), Session(engine, expire_on_commit=False) as session, \
                session.begin():
            yield session

    @contextmanager
    def begin(self):
        """A Core connection in one write transaction (for bulk inserts and upserts)."""
        with _database_errors(self), self.engine.begin() as conn:
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()


@contextmanager
def _database_errors(db: Database):
    """A lost server, a lock held too long, a full disk: one DatabaseError naming the
    database, instead of SQLAlchemy's multi-line text."""
    try:
        yield
    except SQLAlchemyDatabaseError as err:
        reason = (str(err.orig).strip().splitlines() or [type(err.orig).__name__])[0]
        raise DatabaseError(f"metadata database {db.display_url}: {reason}") from err


log = logging.getLogger(__name__)
_open: dict[tuple[int, str], Database] = {}
_lock = threading.Lock()


def open_db(url: str | Database | None = None) -> Database:
    """The metadata database at `url` (see `database_url`), opened once per process; a
    Database given is used as it is (so every `db=` argument takes either)."""
    if isinstance(url, Database):
        return url
    url = database_url(url)
    key = (os.getpid(), url)  # a forked child must not share its parent's connections
    with _lock:
        db = _open.get(key)
        if db is None:
            db = _open[key] = Database(url)
            _interrupt_orphans(db)
        return db


def _interrupt_orphans(db: Database) -> None:
    """Mark runs whose driver died (see `orphans.py`); never stops the database opening."""
    from deepx_flow.meta.orphans import interrupt_orphaned_runs
    try:
        interrupt_orphaned_runs(db)
    except Exception as err:
        log.warning("deepx_flow: could not check for runs whose driver died: %s", err)


def close_all() -> None:
    """Dispose every engine this process opened (tests switch databases with this)."""
    with _lock:
        for db in _open.values():
            db.dispose()
        _open.clear()


def _engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseError(f"metadata database URL {url!r} is not a SQLAlchemy URL "
                            f"(e.g. sqlite:///path/deepx.db or "
                            f"postgresql+psycopg://user@host/db)") from None
    shown = parsed.render_as_string(hide_password=True)
    sqlite = parsed.get_backend_name() == "sqlite"
    if not sqlite:
        try:
            engine = create_engine(url, pool_pre_ping=True)
        except Exception as err:  # a missing driver, a bad option
            raise DatabaseError(f"cannot use the metadata database {shown!r}: {err}") from None
    else:
        path = _sqlite_path(parsed)
        if path is not None:
            _refuse_empty_or_create(path)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S,
                                                  "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection, _record):
            # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's own is deferred).
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            _set_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        options = conn.get_execution_options()
        read_only = options.get("deepx_read_only", False)
        if sqlite:
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
        if not options.get("deepx_migrating"):
            check_transaction(conn, shown, write=not read_only)

    return engine


def _sqlite_path(parsed) -> Path | None:
    """The file of a SQLite URL; None for an in-memory database or a SQLite URI."""
    if not parsed.database or parsed.database == ":memory:" or parsed.query.get("uri"):
        return None
    return Path(parsed.database)


def _refuse_empty_or_create(path: Path) -> None:
    """Refuse a 0-byte database file; create a missing one, whole.

    SQLite would take an empty file as a new database. But deepx_flow never leaves one: a
    new file is written under a temporary name (with SQLite's header, which WAL mode writes
    at once) and linked into place, which fails if another process got there first. So a
    file seen empty lost its history, and is refused rather than silently started again.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = None
    if size == 0:
        raise DatabaseError(
            f"the metadata database file {path} is empty (0 bytes): the runs, assets and "
            f"registry it recorded are gone (truncated, or replaced by an empty file), and "
            f"deepx_flow does not start a new history over them; restore it from a backup, "
            f"or to start afresh delete it (rm {path}) or use another database (--db or "
            f"DEEPX_DB_URL)")
    if size is not None:
        return
    import sqlite3
    import uuid
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
    try:
        conn = sqlite3.connect(new)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        try:
            os.link(new, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
        except OSError:  # a file system without hard links: create it exclusively instead
            _create_exclusive(path, new.read_bytes())
    except OSError as err:
        raise DatabaseError(f"cannot create the metadata database file {path}: "
                            f"{err.strerror or err}") from None
    finally:
        new.unlink(missing_ok=True)


def _create_exclusive(path: Path, content: bytes) -> None:
    """Write `content` to `path` unless it exists (it is empty only for that one write)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as out:
        out.write(content)


def _set_wal(cursor) -> None:
    """Switch the file to WAL, retrying while another process holds a lock. Switching a new
    file needs an exclusive lock, and SQLite answers "database is locked" at once, without
    its busy timeout, when two connections opening a new file both ask for it (deadlock
    avoidance); the loser simply asks again."""
    import sqlite3
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
