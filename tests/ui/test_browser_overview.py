"""The overview page in a real browser, over the seeded database and its live 2-worker
cluster (tests/ui/conftest.py): no JavaScript error, no request off the server; every
registered worker shown with the memory the scheduler reports; the link to Dask's own
dashboard; runs in flight refreshed live; and the page without a reachable scheduler."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest
from sqlmodel import select

from deepx_flow.meta.models import GraphRecord, Run, Task, Worker
from deepx_flow.ui import cluster_state as cs
from deepx_flow.ui.pages.overview import overview_page
from deepx_flow.ui.scheduler_watch import TIMEOUT_S, watch
from tests.helpers import remove_runs
from tests.ui.browser import page_text, screenshot, visit, wait_for_text

pytestmark = pytest.mark.slow

SOURCE = "(name) => Bokeh.documents[0].get_model_by_name('overview-memory-source').data[name]"


def registered_workers(seeded) -> list[Worker]:
    with seeded.db.read() as session:
        return list(session.exec(select(Worker).where(Worker.scheduler == seeded.scheduler,
                                                      Worker.status != "gone")
                                 .order_by(Worker.address)))


def scheduler_workers(seeded) -> dict:
    client = seeded.client
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def test_the_overview_shows_the_cluster(seeded, dashboard, browser):
    workers = registered_workers(seeded)
    live = scheduler_workers(seeded)
    assert len(workers) == 2 and {w.address for w in workers} == set(live)
    page, problems = visit(browser, dashboard, "", "overview")  # the overview is the root
    # Shown at once when the scheduler answers within the page's short wait, else at the
    # next refresh.
    wait_for_text(page, f"Dask scheduler {seeded.scheduler}: 2 workers live")
    rows = page.locator(".deepx-overview-workers .deepx-grid-row")
    assert rows.count() == len(workers)
    for worker, row in zip(workers, rows.all_inner_texts()):  # by address, as registered
        assert worker.address in row and "live" in row
        assert cs.bytes_text(worker.memory_limit) in row
        assert cs.bytes_text(live[worker.address]["memory_limit"]) in row
    # The chart: one entry per worker, the registered limit equal to the scheduler's.
    assert page.evaluate(SOURCE, "worker") == [w.address for w in workers]
    assert page.evaluate(SOURCE, "registered") == [live[w.address]["memory_limit"]
                                                   for w in workers]
    assert all(used > 0 for used in page.evaluate(SOURCE, "used"))
    link = page.locator("a.deepx-dask-dashboard")
    assert link.get_attribute("href") == seeded.dask_dashboard
    text = page_text(page)
    assert f"Dask scheduler {seeded.scheduler}: 2 workers live" in text
    assert "Runs in flight" in text and "Recent failures" in text
    with seeded.db.read() as session:
        failed = len(session.exec(select(Run.id).where(Run.status == "failed")).all())
    assert page.locator(".deepx-overview-failed-runs").count() == 1
    assert page.locator(".deepx-overview-erred-tasks").count() == 1
    assert (f"rows 1-{failed} of {failed}" if failed else "no rows") in \
        page.locator(".deepx-overview-failed-runs .deepx-grid-status").inner_text()
    assert problems == []


def test_new_runs_and_failures_appear_without_reloading(seeded, dashboard, browser):
    """Rows written while the page is open: a run in flight, and a failed run with an erred
    task; they show within a few refreshes, errors by their first line, and leave again."""
    page, problems = visit(browser, dashboard, "overview", "overview-live")
    running, failed = uuid.uuid4().hex, uuid.uuid4().hex
    graph = f"test-overview-{running}"
    shown = {running: ".deepx-overview-inflight", failed: ".deepx-overview-failed-runs"}
    for run_id, table in shown.items():
        assert page.locator(f"{table} a:text('{run_id}')").count() == 0
    now = time.time()
    # As a driver in this very process records runs (so nothing takes them for orphans).
    common = dict(graph_hash=graph, scheduler=seeded.scheduler, cluster="test", n_workers=2,
                  n_tasks=1, n_chunks=1, host=socket.gethostname(), pid=os.getpid(),
                  username="test")
    with seeded.db.session() as session:
        session.add(GraphRecord(hash=graph, n_nodes=1, created_at=now))
        session.flush()
        session.add(Run(id=running, status="running", started_at=now, **common))
        session.add(Run(id=failed, status="failed", started_at=now - 1, ended_at=now,
                        error="ValueError: the overview test failed\nTraceback: hidden",
                        **common))
        session.flush()
        session.add(Task(run_id=failed, key="('overview@test', 0)", tensor="overview@test",
                         operator="relu", worker=sorted(scheduler_workers(seeded))[0],
                         start=now - 1, stop=now, status="erred",
                         error="RuntimeError: the overview task failed\nTraceback: hidden"))
    try:
        for run_id, table in shown.items():
            page.wait_for_selector(f"{table} a:text('{run_id}')", timeout=15_000)
        tasks = page.locator(".deepx-overview-erred-tasks .deepx-grid-row")
        tasks.filter(has_text=failed).wait_for(timeout=15_000)
        screenshot(page, "overview-live")
        failed_row = page.locator(".deepx-overview-failed-runs .deepx-grid-row").filter(
            has_text=failed).inner_text()
        task_row = tasks.filter(has_text=failed).inner_text()
        assert "ValueError: the overview test failed" in failed_row
        assert "RuntimeError: the overview task failed" in task_row
        assert "hidden" not in failed_row + task_row  # the first line only
    finally:
        remove_runs(seeded.db, running, failed)
        with seeded.db.session() as session:
            session.delete(session.get(GraphRecord, graph))
    for run_id, table in shown.items():
        page.locator(f"{table} a:text('{run_id}')").wait_for(state="detached", timeout=15_000)
    assert problems == []


def _shown(table) -> str:
    return str(table.listing.rows)


def _column(table, name: str) -> list:
    return [row[name] for row in table.listing.rows]


def test_without_a_scheduler_the_registered_workers_are_shown(seeded):
    workers = registered_workers(seeded)
    page = overview_page(seeded.db, None)
    assert "No Dask scheduler given" in page.scheduler_status.object
    assert all(w.address in _shown(page.workers) for w in workers)
    assert set(_column(page.workers, "state")) == {"registered"}
    assert "not known" in page.dask_link.object


def test_an_unreachable_scheduler_is_said_and_registered_workers_shown(seeded):
    started = time.monotonic()
    page = overview_page(seeded.db, "tcp://127.0.0.1:1")
    assert time.monotonic() - started < 10
    watch("tcp://127.0.0.1:1").request().result(timeout=TIMEOUT_S + 5)
    page.refresh()  # as the page does every 2 s
    assert "could not be reached" in page.scheduler_status.object
    workers = registered_workers(seeded)
    assert all(w.address in _shown(page.workers) for w in workers)
    assert set(_column(page.workers, "memory used")) == {cs.MISSING}
    assert "No worker is registered under tcp://127.0.0.1:1" in page.workers_note.object


def test_refreshing_stops_when_the_session_ends(seeded, browser):
    """The page refreshes while its browser tab is open and stops once Bokeh has discarded
    the closed tab's session (three seconds after, on this server)."""
    import panel as pn

    from tests.helpers import free_port
    from tests.ui.test_server import wait_until_serving
    built = []

    def route():
        built.append(overview_page(seeded.db, None))
        return built[-1]

    port = free_port()
    server = pn.serve({"overview": route}, address="127.0.0.1", port=port, show=False,
                      threaded=True, unused_session_lifetime_milliseconds=3000,
                      check_unused_sessions_milliseconds=500)
    try:
        wait_until_serving(port)
        page, problems = visit(browser, f"http://127.0.0.1:{port}", "overview",
                               "overview-session")
        shown = built[-1]  # the session the tab is connected to
        first = shown.refreshed.object
        deadline = time.monotonic() + 15
        while shown.refreshed.object == first and time.monotonic() < deadline:
            time.sleep(0.2)
        assert shown.refreshed.object != first, "the open page did not refresh"
        assert problems == []
        page.close()
        time.sleep(6)  # the closed tab's session is discarded within about 4 s
        stopped = shown.refreshed.object
        time.sleep(3)  # longer than a refresh period, and than the text's one-second steps
        assert shown.refreshed.object == stopped
    finally:
        server.stop()

