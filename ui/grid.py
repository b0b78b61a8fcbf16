"""The dashboard's tables as the browser draws them: a plain HTML table, built by a few lines
of our own JavaScript (a Panel `JSComponent`), with an optional pager and headers that ask
the server to sort.

A pager's buttons show only when there is more than one page (its line of how many rows
there are always does: "rows 1-3 of 3", "no rows"); a table that does not page has none.
A cell too long for its column is cut with an ellipsis: hovering over it shows all of its
text, and a click opens it in place (wrapped), a second click closes it.

Why not Panel's Tabulator: on the benchmark's pages (`benchmarks/bench_ui.py`) it was
between a third and a half of the browser's time: its script, and measuring every cell to
fit the columns, again at each resize. The dashboard sends one page of rows at a time and
pages and sorts on the server, so a table needs none of that.

Safety: a cell is set as text (`textContent`), never as HTML; a link cell's URL is its
column's fixed prefix plus the value, URL-encoded. What the browser sends back (a header or
a pager button clicked) is checked against the table's columns and the four pager steps.
"""

from __future__ import annotations

import json
import math
import numbers

import param
from panel.custom import JSComponent

STEPS = ("first", "previous", "next", "last")

_ESM = """
export function render({ model, el }) {
  const table = document.createElement("table")
  const pager = document.createElement("div")
  pager.className = "deepx-grid-pager"
  const buttons = {}
  for (const step of __STEPS__) {
    const button = document.createElement("button")
    button.textContent = step[0].toUpperCase() + step.slice(1)
    button.className = `deepx-grid-${step}`
    button.addEventListener("click", () => model.send_msg({ page: step }))
    buttons[step] = button
    pager.appendChild(button)
  }
  const status = document.createElement("span")
  status.className = "deepx-grid-status"
  pager.appendChild(status)

  function header() {
    const row = document.createElement("tr")
    for (const name of model.columns) {
      const th = document.createElement("th")
      th.dataset.field = name
      let text = name
      if (model.sortable) {
        th.classList.add("deepx-grid-sortable")
        th.title = `sort by ${name}`
        if (model.sort === name) text += model.descending ? " \\u25bc" : " \\u25b2"
        th.addEventListener("click", () => model.send_msg({ sort: name }))
      }
      th.textContent = text
      row.appendChild(th)
    }
    const head = document.createElement("thead")
    head.appendChild(row)
    return head
  }

  function cell(name, value) {
    const td = document.createElement("td")
    td.dataset.field = name
    const text = value === null || value === undefined ? "" : String(value)
    if (typeof value === "number" || model.numeric.includes(name))
      td.classList.add("deepx-grid-number")
    const prefix = model.links[name]
    if (prefix !== undefined && text !== "") {
      const a = document.createElement("a")
      a.href = prefix + encodeURIComponent(text)
      a.textContent = text
      td.appendChild(a)
    } else {
      td.textContent = text
    }
    return td
  }

  function draw() {
    const body = document.createElement("tbody")
    for (const values of model.rows) {
      const row = document.createElement("tr")
      row.className = "deepx-grid-row"
      values.forEach((value, i) => row.appendChild(cell(model.columns[i], value)))
      body.appendChild(row)
    }
    table.replaceChildren(header(), body)
    // The buttons only where there is more than one page; the count of rows always.
    const pages = model.pager && !(model.at_first && model.at_last)
    for (const button of Object.values(buttons)) button.hidden = !pages
    pager.hidden = !model.pager
    status.textContent = model.status
    buttons.first.disabled = buttons.previous.disabled = model.at_first
    buttons.next.disabled = buttons.last.disabled = model.at_last
  }

  // A cell cut short (ellipsis) shows its whole text on hover (its title) and opens in
  // place on a click. Widths are measured only for the cell under the pointer.
  const cut = (td) => td.scrollWidth > td.clientWidth
  table.addEventListener("mouseover", (event) => {
    const td = event.target.closest("td")
    if (td && !td.title && cut(td)) {
      td.title = td.textContent
      td.classList.add("deepx-grid-cut")
    }
  })
  table.addEventListener("click", (event) => {
    const td = event.target.closest("td")
    if (!td || event.target.closest("a")) return
    if (td.classList.contains("deepx-grid-open") || cut(td)) {
      td.classList.toggle("deepx-grid-open")
      td.title = td.textContent
    }
  })

  // Several properties change together (rows, status, buttons): draw once for them.
  let queued = false
  function later() {
    if (queued) return
    queued = true
    queueMicrotask(() => { queued = false; draw() })
  }
  draw()
  model.on(["columns", "rows", "links", "numeric", "sortable", "sort", "descending", "pager",
            "status", "at_first", "at_last"], later)
  el.append(table, pager)
}
"""

_CSS = """
:host { display: block; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 4px 8px; text-align: left;
         white-space: nowrap; overflow: hidden; text-overflow: ellipsis; max-width: 40em; }
th { background: #f4f4f4; font-weight: 600; border-bottom: 2px solid #d0d0d0; }
th.deepx-grid-sortable { cursor: pointer; }
th.deepx-grid-sortable:hover { background: #e8e8e8; }
tr.deepx-grid-row:nth-child(even) { background: #fafafa; }
td.deepx-grid-number { text-align: right; font-variant-numeric: tabular-nums; }
td.deepx-grid-cut { cursor: zoom-in; }
td.deepx-grid-open { white-space: pre-wrap; overflow-wrap: anywhere; cursor: zoom-out; }
.deepx-grid-pager { margin-top: 6px; display: flex; gap: 6px; align-items: center; }
.deepx-grid-pager[hidden], .deepx-grid-pager button[hidden] { display: none; }
.deepx-grid-pager button { font-size: 12px; padding: 2px 10px; }
.deepx-grid-status { color: #555; font-size: 12px; margin-left: 6px; }
"""


def cell_value(value):
    """A value as a cell carries it: numbers stay numbers (right-aligned), None and NaN are
    empty, anything else is its text."""
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return "" if math.isnan(value) else float(value)
    return str(value)


class Grid(JSComponent):
    """A read-only table of `rows` (lists of values, in `columns` order). `links` maps a
    column to the URL prefix its values link to; `numeric` names columns of text aligned as
    numbers (sizes written with their unit); with `sortable`, a click on a header calls
    `on_sort(column)`; with `pager`, the First/Previous/Next/Last buttons call
    `on_page(step)` (shown when there is more than one page) and `status` beside them."""

    columns = param.List(default=[])
    rows = param.List(default=[])
    links = param.Dict(default={})
    numeric = param.List(default=[])
    sortable = param.Boolean(default=False)
    sort = param.String(default="")
    descending = param.Boolean(default=False)
    pager = param.Boolean(default=False)
    status = param.String(default="")
    at_first = param.Boolean(default=True)
    at_last = param.Boolean(default=True)

    _esm = _ESM.replace("__STEPS__", json.dumps(STEPS))  # one list of steps, in Python
    _stylesheets = [_CSS]

    def __init__(self, on_sort=None, on_page=None, **params):
        params.setdefault("sizing_mode", "stretch_width")
        super().__init__(**params)
        self._on_sort, self._on_page = on_sort, on_page

    def show(self, rows) -> None:
        """Show `rows` (lists of raw values). Param sends nothing for unchanged rows (live
        pages refresh every few seconds)."""
        self.rows = [[cell_value(v) for v in row] for row in rows]

    def _handle_msg(self, msg) -> None:
        if not isinstance(msg, dict):
            return
        if msg.get("sort") in self.columns and self.sortable and self._on_sort:
            self._on_sort(msg["sort"])
        elif msg.get("page") in STEPS and self.pager and self._on_page:
            self._on_page(msg["page"])
