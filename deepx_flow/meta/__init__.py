"""The metadata database: registered workers, operators and links; graphs, runs, tasks and
where every chunk of every tensor lives (SQLModel; SQLite by default, PostgreSQL by URL)."""

from deepx_flow.meta.db import Database, database_url, open_db
from deepx_flow.meta.migrations import SCHEMA_VERSION

__all__ = ["Database", "SCHEMA_VERSION", "database_url", "open_db"]
