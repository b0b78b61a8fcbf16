"""The served models in the metadata database: each gateway writes, every heartbeat, a row
per model of its repository (version, state and why, replicas, request counts and the
request rate since its record before), for the dashboard's Serving page.

A gateway that stopped leaves its rows; the page tells them by their age (a row not
written for DEEPX_HEARTBEAT_TIMEOUT_S is a gateway gone).
"""

from __future__ import annotations

import json
import time

from sqlmodel import select

from deepx_flow.meta.models import ServedModelRecord
from deepx_flow.processes import this_process


def _served(models, name):
    from deepx_flow.gateway.errors import NotFound
    try:
        return models.model(name)
    except NotFound:  # unloaded since the snapshot
        return None


def gateway_name() -> str:
    me = this_process()
    return f"{me.host}:{me.pid}"


def record(models, db, gateway: str | None = None) -> list[ServedModelRecord]:
    """Write the rows of every model of `models` (a ModelRepository) for this gateway; the
    rows written."""
    gateway = gateway or gateway_name()
    now = time.time()
    stats = {name: (version, s) for name, version, s in models.snapshot()}
    rows = []
    with db.session() as session:
        before = {r.model: r for r in session.exec(
            select(ServedModelRecord).where(ServedModelRecord.gateway == gateway))}
        for entry in models.index():
            name = entry["name"]
            row = before.get(name) or ServedModelRecord(gateway=gateway, model=name,
                                                        state=entry["state"],
                                                        updated_at=now)
            version, s = stats.get(name, (None, None))
            served = _served(models, name) if version is not None else None
            requests = s.success.count if s else 0
            elapsed = now - row.updated_at
            rate = (requests - row.requests) / elapsed \
                if row.model in before and elapsed > 0 and requests >= row.requests else 0.0
            row.version, row.state = version, entry["state"]
            row.reason = entry["reason"] or None
            row.digest = served.digest if served is not None else None
            row.replicas = json.dumps(models.placement(name)) if served else None
            row.requests, row.failures = requests, s.fail.count if s else 0
            row.rows, row.executions = (s.inference_count, s.execution_count) if s else (0, 0)
            row.latency_seconds = s.success.ns / 1e9 if s else 0.0
            row.requests_per_second, row.updated_at = rate, now
            session.add(row)
            rows.append(row)
    return rows
