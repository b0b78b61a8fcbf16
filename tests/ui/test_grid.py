"""The dashboard's tables without a browser: in-memory rows (`data.Rows`) are ordered as
SQLite orders the same rows, and a `PagedTable` answers the messages its browser-side
`Grid` sends (a header clicked, a pager button) with the right page, status and sort;
anything else the browser might send is ignored."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.ui.data import Rows
from deepx_flow.ui.grid import Grid, cell_value
from deepx_flow.ui.table import PagedTable
from tests.ui.paging import matches

COLUMNS = ("id", "n", "x", "s")


@st.composite
def listed(draw):
    n = draw(st.integers(0, 40))
    return [{"id": i, "n": draw(st.none() | st.integers(-5, 5)),
             "x": draw(st.none() | st.floats(-10, 10, allow_nan=False)),
             "s": draw(st.none() | st.text("ab&#% ", max_size=3))} for i in range(n)]


@settings(max_examples=200, deadline=None)
@given(rows=listed(), sort=st.sampled_from(COLUMNS), descending=st.booleans(),
       size=st.integers(1, 7))
def test_rows_page_and_sort_as_sqlite_orders_them(rows, sort, descending, size):
    # Ties keep the rows' own order, here by id: SQLite's ORDER BY sort, id.
    matches(Rows(COLUMNS, rows, "id"), None, rows, sort, descending, size, "id")


def test_nan_sorts_with_the_missing_values_and_numpy_numbers_as_numbers():
    rows = [{"v": np.int64(3)}, {"v": float("nan")}, {"v": 1.5}, {"v": None}, {"v": 10}]
    got = [r["v"] for r in Rows(("v",), rows, "v").page().rows]
    assert [v for v in got[:2] if v is not None and not math.isnan(v)] == []
    assert got[2:] == [1.5, 3, 10]


def test_cells_carry_numbers_as_numbers_and_missing_as_empty():
    assert cell_value(None) == "" and cell_value(float("nan")) == ""
    assert cell_value(np.int64(7)) == 7 and type(cell_value(np.int64(7))) is int
    assert cell_value(np.float32(0.5)) == 0.5 and cell_value(True) == "True"
    assert cell_value("<b>x</b>") == "<b>x</b>"  # shown as text by the browser


def _table(n: int = 23, size: int = 5) -> PagedTable:
    rows = [{"id": i, "n": (i * 7) % 10, "s": f"r{i:02d}"} for i in range(n)]
    return PagedTable(Rows(("id", "n", "s"), rows, "id"), page_size=size,
                      links={"s": "x?row="}, css_class="deepx-test")


def _ids(table: PagedTable) -> list[int]:
    return [row[0] for row in table.table.rows]


def test_the_pager_buttons_move_through_the_pages():
    table = _table()
    grid = table.table
    assert _ids(table) == [0, 1, 2, 3, 4] and grid.status == "rows 1-5 of 23"
    assert grid.at_first and not grid.at_last
    grid._handle_msg({"page": "next"})
    assert _ids(table) == [5, 6, 7, 8, 9] and grid.status == "rows 6-10 of 23"
    assert not grid.at_first and not grid.at_last
    grid._handle_msg({"page": "last"})
    assert _ids(table) == [20, 21, 22] and grid.status == "rows 21-23 of 23" and grid.at_last
    grid._handle_msg({"page": "next"})  # past the end: stays
    assert _ids(table) == [20, 21, 22]
    grid._handle_msg({"page": "previous"})
    assert _ids(table) == [15, 16, 17, 18, 19]
    grid._handle_msg({"page": "first"})
    assert _ids(table) == [0, 1, 2, 3, 4] and grid.at_first


def test_a_header_click_sorts_the_whole_listing_and_a_second_reverses_it():
    table = _table()
    grid = table.table
    grid._handle_msg({"page": "next"})
    grid._handle_msg({"sort": "n"})  # back to the first page, ascending
    want = sorted(range(23), key=lambda i: ((i * 7) % 10, i))
    assert _ids(table) == want[:5] and grid.sort == "n" and not grid.descending
    grid._handle_msg({"sort": "n"})
    want = sorted(range(23), key=lambda i: (-((i * 7) % 10), i))
    assert _ids(table) == want[:5] and grid.descending


def test_what_else_the_browser_sends_is_ignored():
    table = _table()
    grid = table.table
    before = (list(grid.rows), grid.status, grid.sort, grid.descending)
    for msg in ({"sort": "nope"}, {"sort": ["id"]}, {"page": "jump"}, {"page": 3}, "next",
                None, [], {"sort": "__class__"}):
        grid._handle_msg(msg)
    assert (list(grid.rows), grid.status, grid.sort, grid.descending) == before
    plain = Grid(columns=["a"])  # neither sortable nor paged: clicks do nothing
    plain._handle_msg({"sort": "a"})
    plain._handle_msg({"page": "next"})


def test_rows_going_away_show_the_last_page_left():
    table = _table()
    table.table._handle_msg({"page": "last"})
    table.show(Rows(("id", "n", "s"), [{"id": i, "n": 0, "s": ""} for i in range(7)], "id"))
    assert _ids(table) == [5, 6] and table.table.status == "rows 6-7 of 7"
