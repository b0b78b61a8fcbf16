"""The serving page in a real browser, over the seeded database (tests/ui/conftest.py): the
served model with its version, replicas and request counts as its gateway recorded them,
the model that failed to load with its reason, the gateway judged alive or gone by the age
of its records; no JavaScript error and no request off the server."""

from __future__ import annotations

import json
import time

import pytest
from sqlmodel import select

from deepx_flow.meta.models import ServedModelRecord
from tests.ui.browser import visit

pytestmark = pytest.mark.slow


def test_the_served_models_are_shown_as_recorded(seeded, dashboard, browser):
    with seeded.db.read() as s:
        recorded = {r.model: r for r in s.exec(select(ServedModelRecord))}
    mlp, broken = recorded["mlp"], recorded["broken"]
    assert (mlp.requests, mlp.failures, mlp.rows, mlp.executions) == (7, 1, 11, 7)
    assert len(set(json.loads(mlp.replicas))) == 2 and broken.state == "UNAVAILABLE"
    page, problems = visit(browser, dashboard, "serving", "serving")
    page.wait_for_selector(".deepx-serving .deepx-grid-row")
    shown = page.locator(".deepx-serving .deepx-grid-row").all_inner_texts()
    assert len(shown) == 2
    row = next(r for r in shown if r.split()[0] == "mlp")
    for value in ("READY", "seed-host:4242", "7", "11", json.loads(mlp.replicas)[0]):
        assert value in row, (value, row)
    gone_or_alive = "alive" if time.time() - mlp.updated_at < 60 else "gone"
    assert gone_or_alive in row
    other = next(r for r in shown if r.split()[0] == "broken")
    assert "UNAVAILABLE" in other and "not an ONNX model" in other
    assert problems == []
