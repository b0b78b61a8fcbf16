"""What the dashboard's pages read: short, paged queries over the metadata database.

A page of a table is one query with ORDER BY, LIMIT and OFFSET plus one COUNT, so a list
of a million tasks costs what a page of it costs. Sortable columns are named here; a sort
key from the browser is looked up, never put into SQL as given.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import func
from sqlmodel import col, select

from deepx_flow.meta.models import Event, Run

PAGE_SIZE = 50


@dataclass(frozen=True)
class Page:
    """Rows (dicts, in column order) of one page, and how many rows there are in all."""

    columns: tuple[str, ...]
    rows: list[dict]
    total: int
    offset: int


@dataclass(frozen=True)
class Listing:
    """A sortable, pageable listing: column name -> SQL expression, the default sort, and
    how to turn a result row into shown values."""

    columns: dict
    default_sort: str
    descending: bool
    source: Callable  # () -> a select() over the listed table, with any filter applied
    tie: object  # a unique column that orders rows whose sort values are equal

    def page(self, db, sort: str | None = None, descending: bool | None = None,
             offset: int = 0, limit: int = PAGE_SIZE, **filters) -> Page:
        sort = sort if sort in self.columns else self.default_sort
        descending = self.descending if descending is None else descending
        order = self.columns[sort]
        query = self.source(**filters).with_only_columns(
            *[c.label(n) for n, c in self.columns.items()])
        query = query.order_by(order.desc() if descending else order.asc(), self.tie)
        count = select(func.count()).select_from(self.source(**filters).subquery())
        offset, limit = max(0, int(offset)), max(1, int(limit))
        with db.read() as session:
            conn = session.connection()
            total = conn.execute(count).scalar_one()
            rows = conn.execute(query.offset(offset).limit(limit)).all()
        return Page(tuple(self.columns), [dict(r._mapping) for r in rows], int(total), offset)


@dataclass(frozen=True)
class Rows:
    """Rows already in memory (dicts by column: a cluster's workers, GPUs, storage tiers, the
    registered operators; hundreds at most) listed like a `Listing`, sorted and paged in
    Python. Missing values come first in ascending order, as SQLite orders NULLs; numbers
    sort as numbers, before text."""

    columns: tuple
    rows: list
    default_sort: str
    descending: bool = False

    def page(self, db=None, sort: str | None = None, descending: bool | None = None,
             offset: int = 0, limit: int = PAGE_SIZE) -> Page:
        sort = sort if sort in self.columns else self.default_sort
        descending = self.descending if descending is None else descending
        ordered = sorted(self.rows, key=lambda row: _order(row.get(sort)), reverse=descending)
        offset, limit = max(0, int(offset)), max(1, int(limit))
        return Page(tuple(self.columns), ordered[offset:offset + limit], len(ordered), offset)


def _order(value) -> tuple:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return (0, 0, "") if math.isnan(value) else (1, float(value), "")
    if value is None:
        return (0, 0, "")
    return (2, 0, str(value))


def _runs(status: str | None = None):
    query = select(Run)
    return query.where(Run.status == status) if status else query


RUNS = Listing(
    columns={"id": col(Run.id), "status": col(Run.status), "kind": col(Run.kind),
             "started": col(Run.started_at),
             "seconds": func.coalesce(col(Run.ended_at), col(Run.started_at))
             - col(Run.started_at),
             "tasks": col(Run.n_tasks), "workers": col(Run.n_workers),
             "cluster": col(Run.cluster), "host": col(Run.host), "user": col(Run.username),
             "error": col(Run.error)},
    default_sort="started", descending=True, source=_runs, tie=col(Run.id))


def _events(run_id: str | None = None):
    query = select(Event)
    return query.where(Event.run_id == run_id) if run_id is not None else query


EVENTS = Listing(
    columns={"at": col(Event.at), "kind": col(Event.kind), "worker": col(Event.worker),
             "key": col(Event.key), "message": col(Event.message)},
    default_sort="at", descending=False, source=_events, tie=col(Event.id))
