"""The serving page: every model a gateway serves or failed to load (`deepx-flow serve
--model-repository`), as the gateway last recorded it (`serving/records.py`): its version,
state (and why it is not served), the workers its replicas run on, its requests, failures,
rows and batches, the request rate, the mean latency, and whether its gateway is still
alive (its records fresh) or gone.
"""

from __future__ import annotations

import time

import panel as pn
from sqlalchemy import Float, bindparam, case
from sqlmodel import col, select

from deepx_flow.config import settings
from deepx_flow.meta.models import ServedModelRecord
from deepx_flow.ui.data import Listing
from deepx_flow.ui.table import PagedTable

M = ServedModelRecord

# A gateway records its models every DEEPX_HEARTBEAT_S; one whose records are older than
# DEEPX_HEARTBEAT_TIMEOUT_S is gone (stopped, or died). The clock is read when the query
# runs, so a page left open judges with a current one.
_NOW = bindparam("now", callable_=time.time, type_=Float)
GATEWAY_STATE = case((col(M.updated_at) >= _NOW - bindparam(
    "timeout", callable_=lambda: settings().heartbeat_timeout_s, type_=Float), "alive"),
    else_="gone")
MEAN_MS = case((col(M.requests) > 0, col(M.latency_seconds) * 1000.0 / col(M.requests)),
               else_=None)
BATCH = case((col(M.executions) > 0, col(M.rows) * 1.0 / col(M.executions)), else_=None)

SERVED = Listing(
    columns={"model": col(M.model), "version": col(M.version), "state": col(M.state),
             "gateway": col(M.gateway), "gateway_state": GATEWAY_STATE,
             "replicas": col(M.replicas), "requests": col(M.requests),
             "failures": col(M.failures), "rows": col(M.rows),
             "executions": col(M.executions), "mean_batch": BATCH,
             "requests_per_second": col(M.requests_per_second), "mean_ms": MEAN_MS,
             "reason": col(M.reason), "updated": col(M.updated_at)},
    default_sort="model", descending=False, source=lambda: select(M),
    tie=col(M.gateway))


def serving_page(db, scheduler=None):
    table = PagedTable(SERVED, db, css_class="deepx-serving")
    return pn.Column(pn.pane.Markdown("## Serving"), table, sizing_mode="stretch_width")
