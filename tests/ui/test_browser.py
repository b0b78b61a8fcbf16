"""The dashboard in a real browser: Playwright drives Debian's headless Chromium against a
server on loopback, over a database seeded by a real run. Every page must load with no
JavaScript error and no request leaving the server, and show the seeded rows. Screenshots
go to DEEPX_TEST_ARTIFACTS (default `.test-artifacts/` here; not committed).

Without /usr/bin/chromium these tests skip, unless DEEPX_REQUIRE_BROWSER=1 (set by
`.ci/run`, which installs it) makes that a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import deepx_flow as dx
from tests.helpers import free_port
from tests.ui.test_server import wait_until_serving

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("DEEPX_TEST_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / ".test-artifacts"))
IDLE = "() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle"

pytestmark = pytest.mark.slow


def _browser_or_skip():
    reason = None
    if not Path(CHROMIUM).is_file():
        reason = f"{CHROMIUM} is missing (apt install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "playwright is not installed (pip install -e '.[dev]')"
    if reason:
        if os.environ.get("DEEPX_REQUIRE_BROWSER") == "1":
            pytest.fail(f"DEEPX_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, client):
    """A database seeded by a real run, and the dashboard serving it on loopback."""
    _browser_or_skip()
    from deepx_flow.meta import open_db
    from deepx_flow.ui.server import serve
    url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'deepx.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEEPX_DB_URL", url)
        x = dx.random.normal((400, 64), seed=3, dtype="float64")
        dx.run((dx.tanh(x) * 2.0).sum(axis=0), client=client)
    db = open_db(url)
    port = free_port()
    server = serve(db=url, port=port, threaded=True)
    try:
        wait_until_serving(port)
        yield f"http://127.0.0.1:{port}", db
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(dashboard):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        yield chromium
        chromium.close()


def visit(browser, base: str, path: str, shot: str):
    """Open `path`; wait until Bokeh has rendered it; return the page and what went wrong
    (JavaScript errors, console errors, requests to anywhere but the server)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: problems.append(f"console error: {m.text}")
            if m.type == "error" else None)
    page.on("request", lambda r: problems.append(f"request off the server: {r.url}")
            if not r.url.startswith((base, "data:", "blob:")) else None)
    page.goto(f"{base}/{path}")
    page.wait_for_function(IDLE, timeout=30_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{shot}.png"), full_page=True)
    return page, problems


def test_the_runs_page_lists_the_seeded_run(dashboard, browser):
    base, db = dashboard
    from deepx_flow.meta.queries import list_runs
    [run] = list_runs(db)
    page, problems = visit(browser, base, "runs", "runs")
    page.wait_for_selector(".deepx-runs .tabulator-row")
    rows = page.locator(".deepx-runs .tabulator-row")
    assert rows.count() == 1
    assert run.id in rows.first.inner_text() and "succeeded" in rows.first.inner_text()
    assert page.get_by_text("rows 1-1 of 1").count() == 1
    assert problems == []
