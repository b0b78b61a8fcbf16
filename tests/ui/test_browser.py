"""The runs and run pages in a real browser, over the seeded database (tests/ui/conftest.py):
no JavaScript error, no request off the server, the seeded rows shown, and the run page's
timeline has one bar per task. Screenshots go to `.test-artifacts/` (not committed)."""

from __future__ import annotations

import pytest

from deepx_flow.meta.queries import list_runs, measured_ratio, run_tasks, task_summary
from deepx_flow.ui.timeline import LABELS
from tests.helpers import remove_runs
from tests.ui.browser import IDLE, PAGE_TEXT, figure_box, page_text, shown_run_id, visit
from tests.ui.paging import sql_order

pytestmark = pytest.mark.slow

BARS = ("() => Bokeh.documents[0].get_model_by_name('timeline-source')"
        ".data['left'].length")
# What the timeline's hover says each bar is: its key and, looked up from its number by the
# hover's own formatter, its operator.
HOVERED = """async () => {
  const doc = Bokeh.documents[0];
  const d = doc.get_model_by_name('timeline-source').data;
  const name = doc.get_model_by_name('timeline-operators');
  return Promise.all(Array.from(d.key, async (key, i) =>
    [key, await name.format(d.operator[i], '', {})]));
}"""


def test_the_runs_page_lists_the_seeded_runs(seeded, dashboard, browser):
    runs = list_runs(seeded.db, limit=1000)
    assert len(runs) >= 4  # run, persist, materialize, the schedule's tick
    page, problems = visit(browser, dashboard, "runs", "runs")
    page.wait_for_selector(".deepx-runs .deepx-grid-row")
    rows = page.locator(".deepx-runs .deepx-grid-row")
    assert rows.count() == len(runs)
    shown = "\n".join(rows.all_inner_texts())
    assert all(r.id in shown for r in runs)
    first = rows.first.inner_text()  # newest first
    assert runs[0].id in first and runs[0].status in first
    assert page.get_by_text(f"rows 1-{len(runs)} of {len(runs)}").count() == 1
    assert problems == []


def test_a_header_click_sorts_the_runs_in_the_database_and_a_second_reverses(seeded,
                                                                             dashboard,
                                                                             browser):
    from playwright.sync_api import expect
    runs = [{"id": r.id, "tasks": r.n_tasks} for r in list_runs(seeded.db, limit=1000)]
    page, problems = visit(browser, dashboard, "runs", "runs-sorted")
    page.wait_for_selector(".deepx-runs .deepx-grid-row")
    for descending, arrow in ((False, "\u25b2"), (True, "\u25bc")):
        page.locator(".deepx-runs th[data-field='tasks']").click()
        expect(page.locator(".deepx-runs th[data-field='tasks']")).to_have_text(
            f"tasks {arrow}")
        want = [r["id"] for r in sql_order(runs, "tasks", descending, "id")]
        expect(page.locator(".deepx-runs td[data-field='id']")).to_have_text(want)
    assert page.locator(".deepx-runs .deepx-grid-first").is_disabled()
    assert page.locator(".deepx-runs .deepx-grid-last").is_disabled()  # one page
    assert problems == []


def test_the_run_page_has_one_bar_per_task(seeded, dashboard, browser):
    run = list_runs(seeded.db, limit=1000)[-1]  # the first run: dx.run of tanh * 2, summed
    tasks = run_tasks(seeded.db, run.id)
    assert tasks and all(t.start is not None and t.stop is not None for t in tasks)
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "run")
    assert page.evaluate(BARS) == len(tasks)
    assert sorted(map(tuple, page.evaluate(HOVERED))) == sorted((t.key, t.operator)
                                                                for t in tasks)
    text = page_text(page)
    assert shown_run_id(page) == run.id and "succeeded" in text
    assert "Work per operator" in text
    measured = measured_ratio(task_summary(seeded.db, run.id))
    assert measured is not None
    shown = ("inf (no data moved between workers)" if measured == float("inf")
             else f"{measured:.1f}")
    assert f"compute/communication: measured {shown}" in text
    assert problems == []


def test_the_run_page_links_to_its_graph(seeded, dashboard, browser):
    run = list_runs(seeded.db, limit=1000)[-1]
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "run-graph-link")
    page.locator(".deepx-run-graph a").click()
    page.wait_for_url(f"**/graph?run={run.id}")
    page.wait_for_function(IDLE, timeout=30_000)
    assert run.id in page_text(page)
    assert problems == []


def test_the_runs_page_links_to_the_run_page(seeded, dashboard, browser):
    run = list_runs(seeded.db, limit=1)[0]
    page, problems = visit(browser, dashboard, "runs", "runs-link")
    page.wait_for_selector(".deepx-runs .deepx-grid-row")
    page.locator(f".deepx-runs a:text('{run.id}')").click()
    page.wait_for_url(f"**/run?id={run.id}")
    page.wait_for_function(IDLE, timeout=30_000)
    assert shown_run_id(page) == run.id
    assert problems == []


def test_an_unknown_run_id_says_so(dashboard, browser):
    page, problems = visit(browser, dashboard, "run?id=nosuchrun", "run-unknown")
    assert "no run 'nosuchrun'" in page_text(page)
    assert problems == []


def test_an_id_that_looks_like_markup_is_shown_as_typed(dashboard, browser):
    page, problems = visit(browser, dashboard, "run?id=%3Ci%20id%3Dinjected%3Ex%3C/i%3E",
                           "run-markup")
    assert "no run '<i id=injected>x</i>'" in page_text(page)
    assert page.locator("#injected").count() == 0
    assert problems == []


def test_a_failed_run_shows_its_error_and_its_erred_tasks(seeded, dashboard, browser):
    [run] = list_runs(seeded.db, status="failed", limit=1000)  # the corrupt Zarr chunk
    tasks = run_tasks(seeded.db, run.id)
    erred = [t for t in tasks if t.status == "erred"]
    assert erred and run.error
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "run-failed")
    statuses = page.evaluate("() => Bokeh.documents[0].get_model_by_name('timeline-source')"
                             ".data['status']")
    assert sorted(statuses) == sorted(LABELS.get(t.status, t.status)
                                      for t in tasks if t.start is not None)
    text = page_text(page)
    assert "failed" in text and " ".join(run.error.splitlines()[0].split()) in text
    assert problems == []


def test_the_page_of_a_running_run_follows_it_until_it_ends(seeded, dashboard, browser):
    """A run written as a driver in this process would: its page shows the first task,
    then, without reloading, the second and the run's end (failed, with an error that
    looks like markup)."""
    import os
    import socket
    import time
    import uuid

    from deepx_flow.meta.models import GraphRecord, Run, Task
    run_id, now = uuid.uuid4().hex, time.time()
    graph = f"test-run-page-{run_id}"
    worker = "tcp://127.0.0.1:1"

    def task(i):
        return Task(run_id=run_id, key=f"('live@test', {i})", tensor="live@test",
                    operator="relu", worker=worker, start=now + i, stop=now + i + 0.5)
    with seeded.db.session() as session:
        session.add(GraphRecord(hash=graph, n_nodes=1, created_at=now))
        session.flush()
        session.add(Run(id=run_id, graph_hash=graph, status="running", started_at=now,
                        scheduler=seeded.scheduler, cluster="test", n_workers=1, n_tasks=2,
                        n_chunks=2, host=socket.gethostname(), pid=os.getpid(),
                        username="test"))
        session.flush()
        session.add(task(0))
    try:
        page, problems = visit(browser, dashboard, f"run?id={run_id}", "run-live")
        assert page.evaluate(BARS) == 1 and "running" in page_text(page)
        with seeded.db.session() as session:
            session.add(task(1))
            ended = session.get(Run, run_id)
            ended.status, ended.error = "failed", 'ValueError: <b id="injected">boom</b>'
        page.wait_for_function(f"() => ({BARS})() === 2", timeout=15_000)
        page.wait_for_function(f"() => ({PAGE_TEXT})().includes('boom')", timeout=15_000)
        # Text from the database is shown as typed, never as markup.
        assert 'ValueError: <b id="injected">boom</b>' in page_text(page)
        assert page.locator("#injected").count() == 0
        listed, more_problems = visit(browser, dashboard, "runs", "runs-markup")  # a table
        listed.wait_for_selector(".deepx-runs .deepx-grid-row")
        row = listed.locator(".deepx-runs .deepx-grid-row").filter(has_text=run_id)
        assert '<b id="injected">boom</b>' in row.inner_text()
        assert listed.locator("#injected").count() == 0
        assert problems == more_problems == []
    finally:
        remove_runs(seeded.db, run_id)
        with seeded.db.session() as session:
            session.delete(session.get(GraphRecord, graph))


LOSS_POINTS = ("() => [Bokeh.documents[0].get_model_by_name('loss-source').data['step'].length,"
               " Bokeh.documents[0].get_model_by_name('eval-loss-source').data['step']"
               ".length]")


def test_a_training_run_page_draws_the_loss_curve(seeded, dashboard, browser):
    from sqlmodel import select
    from deepx_flow.meta.models import Run
    fit = seeded.fit
    with seeded.db.read() as s:
        run_id = s.exec(select(Run.id).where(Run.training_id == fit.training_id,
                                             Run.kind == "train")).first()
    page, problems = visit(browser, dashboard, f"run?id={run_id}", "run-training")
    assert page.evaluate(LOSS_POINTS) == [fit.steps, len(fit.evaluations)] == [12, 3]
    steps = page.evaluate("() => Array.from(Bokeh.documents[0]"
                          ".get_model_by_name('loss-source').data['loss'])")
    assert steps == pytest.approx([h["loss"] for h in fit.history], rel=1e-12)
    assert f"training {fit.training_id}: succeeded, 12 of 12 steps" in page_text(page)
    assert page.locator(".deepx-run-training").is_visible()
    assert problems == []


def test_a_plain_run_page_has_no_training_section(seeded, dashboard, browser):
    run = list_runs(seeded.db, limit=1000)[-1]
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "run-no-training")
    assert page.locator(".deepx-run-facts").is_visible()
    assert not page.locator(".deepx-run-training").is_visible()
    assert figure_box(page, "loss-curve") is None  # no empty loss chart either
    assert figure_box(page, "timeline") is not None
    assert problems == []
