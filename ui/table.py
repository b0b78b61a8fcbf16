"""A table over a `data.Listing` that pages and sorts in the database: the browser gets one
page at a time, and a click on a column header orders the whole listing, not the page."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import panel as pn

from deepx_flow.ui.data import PAGE_SIZE, Listing
from deepx_flow.ui.text import Text

TIME_COLUMNS = ("started", "ended", "at", "created", "tick", "start", "stop", "seen",
                "heartbeat", "finished")


def utc_text(t: float) -> str:
    """A Unix time as the dashboard shows it: the UTC date and time to the second."""
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def shown(value, column: str):
    """A value as the table shows it: times as UTC dates, seconds rounded."""
    if value is None:
        return ""
    if column in TIME_COLUMNS and isinstance(value, (int, float)):
        return utc_text(value)
    if isinstance(value, float):
        return round(value, 3)
    return value


def text_table(columns, css_class: str, **options) -> pn.widgets.Tabulator:
    """A read-only table of `columns`, empty until `show_rows` fills it."""
    return pn.widgets.Tabulator(pd.DataFrame(columns=list(columns)), disabled=True,
                                show_index=False, sizing_mode="stretch_width",
                                css_classes=[css_class], **options)


def show_rows(table: pn.widgets.Tabulator, frame: pd.DataFrame) -> None:
    """Show `frame` in `table`; an unchanged table is not sent to the browser again (live
    pages refresh every few seconds)."""
    if not frame.equals(table.value):
        table.value = frame


class PagedTable(pn.viewable.Viewer):
    """`listing` read through `db`, `page_size` rows at a time, with `filters` applied.
    `links` maps a column to the URL prefix its values link to (e.g. {"id": "run?id="})."""

    def __init__(self, listing: Listing, db, page_size: int = PAGE_SIZE, links=None,
                 css_class: str = "deepx-table", **filters):
        super().__init__()
        self.listing, self.db, self.page_size, self.filters = listing, db, page_size, filters
        self.sort, self.descending, self.offset = listing.default_sort, listing.descending, 0
        formatters = {c: {"type": "link", "urlPrefix": prefix, "target": "_self"}
                      for c, prefix in (links or {}).items()}
        self.table = pn.widgets.Tabulator(
            pd.DataFrame(), pagination=None, disabled=True, show_index=False,
            formatters=formatters, sizing_mode="stretch_width", css_classes=[css_class],
            header_filters=False)
        self.table.param.watch(self._sorted, "sorters")
        buttons = [pn.widgets.Button(name=label, css_classes=[f"{css_class}-{label.lower()}"])
                   for label in ("First", "Previous", "Next", "Last")]
        for button, step in zip(buttons, ("first", "previous", "next", "last")):
            button.on_click(lambda _event, step=step: self._go(step))
        self.status = Text("", css_classes=[f"{css_class}-status"])
        self.layout = pn.Column(self.table, pn.Row(*buttons, self.status),
                                sizing_mode="stretch_width")
        self.refresh()

    def __panel__(self):
        return self.layout

    def refresh(self, **filters) -> None:
        """Read the current page again (with new `filters`, if given: back to the first)."""
        if filters:
            self.filters, self.offset = filters, 0
        page = self.listing.page(self.db, self.sort, self.descending, self.offset,
                                 self.page_size, **self.filters)
        if page.total and self.offset >= page.total:  # rows went away: show the last page
            self.offset = (page.total - 1) // self.page_size * self.page_size
            page = self.listing.page(self.db, self.sort, self.descending, self.offset,
                                     self.page_size, **self.filters)
        self.total = page.total
        show_rows(self.table, pd.DataFrame(
            [{c: shown(r[c], c) for c in page.columns} for r in page.rows],
            columns=list(page.columns)))
        last = min(page.offset + len(page.rows), page.total)
        self.status.object = (f"rows {page.offset + 1}-{last} of {page.total:,}"
                              if page.total else "no rows")

    def _go(self, step: str) -> None:
        last = max(0, (self.total - 1) // self.page_size * self.page_size)
        self.offset = {"first": 0, "previous": max(0, self.offset - self.page_size),
                       "next": min(last, self.offset + self.page_size), "last": last}[step]
        self.refresh()

    def _sorted(self, event) -> None:
        sorters = [s for s in event.new or () if s.get("field") in self.listing.columns]
        if not sorters:
            return
        self.sort, self.descending = sorters[0]["field"], sorters[0].get("dir") == "desc"
        self.offset = 0
        self.refresh()
