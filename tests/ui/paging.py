"""Checking a `data.Listing` against Python: read every page of it, and sort expected rows
the way the database does (SQLite: NULL before any value, ties broken by the tie column)."""

from __future__ import annotations


def every_page(listing, db, sort: str, descending: bool, size: int, **filters) -> list[dict]:
    """All the listing's rows, read `size` at a time; checks each page's total and offset."""
    rows, offset, total = [], 0, None
    while True:
        page = listing.page(db, sort, descending, offset, size, **filters)
        assert page.offset == offset and (total is None or page.total == total)
        total = page.total
        rows += page.rows
        if len(page.rows) < size:
            break
        offset += size
    assert len(rows) == total
    return rows


def sql_order(rows: list[dict], sort: str, descending: bool, tie: str) -> list[dict]:
    """`rows` ordered as ORDER BY sort [DESC], tie ASC orders them on SQLite."""
    out = sorted(rows, key=lambda r: r[tie])
    return sorted(out, key=lambda r: (r[sort] is not None, r[sort] if r[sort] is not None
                                      else 0), reverse=descending)

def matches(listing, db, want, sort, descending, size, tie, **filters):
    """Every page of `listing` equals `want` (rows as dicts) in SQL's order."""
    got = every_page(listing, db, sort, descending, size, **filters)
    want = [{c: r[c] for c in listing.columns}
            for r in sql_order(want, sort, descending, tie)]
    assert got == want
