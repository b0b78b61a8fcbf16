"""A table over a `data.Listing` that pages and sorts in the database (or over in-memory
`data.Rows`, paged and sorted in Python): the browser gets one page at a time, and a click
on a column header orders the whole listing, not the page. Drawn by `grid.Grid`.

Values are written here, once for every page: times as UTC dates, sizes in bytes with
their unit (`size_text`, the project's `format_bytes`, as the CLI and `Plan.explain` write
them), other numbers rounded."""

from __future__ import annotations

import datetime as dt
import numbers

import panel as pn

from deepx_flow.registry.cluster import format_bytes
from deepx_flow.ui.data import PAGE_SIZE
from deepx_flow.ui.grid import Grid

TIME_COLUMNS = ("started", "ended", "at", "created", "tick", "start", "stop", "seen",
                "heartbeat", "finished")
BYTE_COLUMNS = ("bytes", "nbytes", "bytes in", "bytes out", "size")


def utc_text(t: float) -> str:
    """A Unix time as the dashboard shows it: the UTC date and time to the second."""
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def size_text(n) -> str:
    """A number of bytes as every page writes it: "390.6 MiB", "512 B" ("-": unknown)."""
    if n is None or isinstance(n, bool) or not isinstance(n, numbers.Real) or n != n:
        return "-"
    return format_bytes(n)


def shown(value, column: str):
    """A value as the table shows it: times as UTC dates, sizes with their unit, seconds
    rounded."""
    if value is None:
        return ""
    if column in TIME_COLUMNS and isinstance(value, (int, float)):
        return utc_text(value)
    if column in BYTE_COLUMNS and isinstance(value, numbers.Real) \
            and not isinstance(value, bool):
        return size_text(value)
    if isinstance(value, float):
        return round(value, 3)
    return value


def text_table(columns, css_class: str) -> Grid:
    """A read-only table of `columns`, neither paged nor sorted, empty until `show` fills it
    (`Grid.show`, with rows of values in column order)."""
    return Grid(columns=list(columns), numeric=_numeric(columns), css_classes=[css_class])


def _numeric(columns) -> list[str]:
    """The columns whose text is a number with its unit: aligned as numbers."""
    return [c for c in columns if c in BYTE_COLUMNS]


class PagedTable(pn.viewable.Viewer):
    """`listing` (a `data.Listing` read through `db`, or in-memory `data.Rows`), `page_size`
    rows at a time, with `filters` applied. `links` maps a column to the URL prefix its
    values link to (e.g. {"id": "run?id="}); `formats` a column to the function that writes
    its values (after sorting, which uses the values themselves)."""

    def __init__(self, listing, db=None, page_size: int = PAGE_SIZE, links=None,
                 css_class: str = "deepx-table", formats=None, **filters):
        super().__init__()
        self.listing, self.db, self.page_size, self.filters = listing, db, page_size, filters
        self.formats = formats or {}
        self.offset = 0
        # The sort lives on the grid, which shows it in its header.
        self.table = Grid(columns=list(listing.columns), links=dict(links or {}),
                          numeric=_numeric(listing.columns),
                          sortable=True, pager=True, sort=listing.default_sort,
                          descending=listing.descending, css_classes=[css_class],
                          on_sort=self._sorted, on_page=self._go)
        self.refresh()

    def __panel__(self):
        return self.table

    @property
    def visible(self) -> bool:
        return self.table.visible

    @visible.setter
    def visible(self, value: bool) -> None:
        self.table.visible = value

    def show(self, listing) -> None:
        """List `listing` instead (new in-memory rows, say), keeping the sort and page."""
        self.listing = listing
        self.refresh()

    def refresh(self, **filters) -> None:
        """Read the current page again (with new `filters`, if given: back to the first)."""
        if filters:
            self.filters, self.offset = filters, 0
        page = self._page()
        if page.total and self.offset >= page.total:  # rows went away: show the last page
            self.offset = self._last_offset(page.total)
            page = self._page()
        self.total = page.total
        self.table.show([[self._shown(r[c], c) for c in page.columns] for r in page.rows])
        last = min(page.offset + len(page.rows), page.total)
        # Param sends only what changed.
        self.table.param.update(
            status=f"rows {page.offset + 1}-{last} of {page.total:,}" if page.total
            else "no rows", at_first=self.offset == 0, at_last=last >= page.total)

    def _page(self):
        return self.listing.page(self.db, self.table.sort, self.table.descending, self.offset,
                                 self.page_size, **self.filters)

    def _last_offset(self, total: int) -> int:
        return max(0, (total - 1) // self.page_size * self.page_size)

    def _shown(self, value, column: str):
        if value is not None and column in self.formats:
            return self.formats[column](value)
        return shown(value, column)

    def _go(self, step: str) -> None:
        last = self._last_offset(self.total)
        self.offset = {"first": 0, "previous": max(0, self.offset - self.page_size),
                       "next": min(last, self.offset + self.page_size), "last": last}[step]
        self.refresh()

    def _sorted(self, column: str) -> None:
        """A click on a column's header: sort by it, or the other way if it is the sort."""
        if column not in self.listing.columns:
            return
        descending = column == self.table.sort and not self.table.descending
        self.offset = 0
        self.table.param.update(sort=column, descending=descending)
        self.refresh()
