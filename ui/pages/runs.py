"""The runs page: every recorded run, newest first, with status and duration; it reads the
current page again every few seconds, so runs that start or end show up."""

from __future__ import annotations

import panel as pn

from deepx_flow.ui.data import RUNS
from deepx_flow.ui.live import refresh_while_open, shown_failures
from deepx_flow.ui.table import PagedTable
from deepx_flow.ui.text import Text

STATUSES = ["any", "running", "succeeded", "failed", "interrupted"]
PERIOD_MS = 5000


def runs_page(db, scheduler=None):
    table = PagedTable(RUNS, db, links={"id": "run?id="}, css_class="deepx-runs")
    status = pn.widgets.Select(name="status", options=STATUSES, value="any", width=160)
    status.param.watch(lambda e: table.refresh(status=None if e.new == "any" else e.new),
                       "value")
    problem = Text("", css_classes=["deepx-runs-refresh"])
    refresh_while_open(shown_failures(table.refresh, problem), PERIOD_MS)
    return pn.Column(pn.pane.Markdown("## Runs"), status, table, problem,
                     sizing_mode="stretch_width")
