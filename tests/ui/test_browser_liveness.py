"""The dashboard shows what is alive, in a real browser: a second cluster registered beside
the seeded one (tests/ui/conftest.py) is listed while its client runs; once its user closes
the client, the overview (served without a scheduler, so it lists every cluster's workers)
and the registry's network tab list only the seeded cluster, and the history box (or
`?history=1`) brings the closed one back, marked gone."""

from __future__ import annotations

import logging
import time

import pytest
from distributed import Client, LocalCluster
from sqlmodel import select

import deepx_flow as dx
from deepx_flow.meta.models import Worker
from tests.helpers import free_port, threaded_memory_off
from tests.ui.browser import page_text, screenshot, visit

pytestmark = pytest.mark.slow

CHART = "() => Bokeh.documents[0].get_model_by_name('overview-memory-source').data.worker"


def addresses(db, scheduler: str) -> list[str]:
    with db.read() as s:
        return sorted(s.exec(select(Worker.address).where(Worker.scheduler == scheduler)))


def worker_rows(page) -> list[str]:
    return page.locator(".deepx-overview-workers .deepx-grid-row").all_inner_texts()


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


@pytest.fixture
def unfiltered(seeded):
    """A dashboard on the seeded database given no scheduler: its overview lists the
    registered workers of every cluster."""
    from deepx_flow.ui.server import serve
    from tests.ui.test_server import wait_until_serving
    port = free_port()
    server = serve(db=seeded.url, port=port, threaded=True)
    try:
        wait_until_serving(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_a_closed_cluster_leaves_the_overview_and_the_registry(seeded, unfiltered, browser,
                                                               monkeypatch):
    monkeypatch.setenv("DEEPX_HEARTBEAT_S", "0.5")  # the close is seen within half a second
    live = addresses(seeded.db, seeded.scheduler)
    with threaded_memory_off(), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, host="127.0.0.1",
                         protocol="tcp", dashboard_address="127.0.0.1:0",
                         silence_logs=logging.ERROR) as cluster:
        client = Client(cluster, set_as_default=False)
        try:
            dx.run(dx.arange(4.0).sum(), client=client)
            closed_scheduler = client.scheduler.address
            closed = addresses(seeded.db, closed_scheduler)
            assert len(closed) == 2 and not set(closed) & set(live)
            page, problems = visit(browser, unfiltered, "", "liveness-both")
            wait_until(lambda: all(any(a in row for row in worker_rows(page))
                                   for a in live + closed), "both clusters' workers")
        finally:
            client.close()  # the user closes it; the cluster object is left to its `with`

        # The overview refreshes every 2 s: the closed cluster's workers and bars leave it.
        wait_until(lambda: not any(a in row for row in worker_rows(page) for a in closed),
                   "the closed cluster's workers to leave the overview")
        screenshot(page, "liveness-overview")
        rows = worker_rows(page)
        assert all(any(a in row for row in rows) for a in live)
        assert not set(closed) & set(page.evaluate(CHART))
        assert set(live) <= set(page.evaluate(CHART))
        assert "registered workers of closed or gone clusters not shown" in page_text(page)

        # ?history=1: the closed ones are back, marked gone.
        history, more = visit(browser, unfiltered, "?history=1", "liveness-history")
        history.wait_for_selector(".deepx-overview-workers .deepx-grid-row")
        gone = [row for row in worker_rows(history) if any(a in row for a in closed)]
        assert len(gone) == 2 and all("gone" in row for row in gone)

        # The registry's network tab offers the live cluster alone; the box brings both.
        registry, most = visit(browser, unfiltered, "registry?section=network",
                               "liveness-registry")
        registry.wait_for_selector(".deepx-storage-tiers .deepx-grid-row")
        assert f"cluster: scheduler {seeded.scheduler}" in page_text(registry)
        assert closed_scheduler not in page_text(registry)
        tiers = registry.locator(".deepx-storage-tiers td[data-field='worker']")
        assert set(tiers.all_inner_texts()) == set(live)
        registry.locator(".deepx-cluster-history input").click()
        chooser = registry.locator(".deepx-cluster select")
        chooser.wait_for()
        wait_until(lambda: closed_scheduler in " ".join(
            chooser.locator("option").all_inner_texts()), "the closed cluster offered")
        [label] = [t for t in chooser.locator("option").all_inner_texts()
                   if t.startswith(closed_scheduler)]  # "address (seen ... UTC)"
        chooser.select_option(label=label)
        wait_until(lambda: set(tiers.all_inner_texts()) == set(closed),
                   "the closed cluster's tiers")
        statuses = registry.locator(".deepx-storage-tiers td[data-field='status']")
        assert set(statuses.all_inner_texts()) == {"gone"}
        screenshot(registry, "liveness-registry-history")
        assert problems == [] and more == [] and most == []
