"""The schedules page in a real browser, over the seeded database (tests/ui/conftest.py):
the schedule and its tick as the database holds them, the tick's run linked to its page,
the ticks filtered by status and by schedule; no JavaScript error and no request off the
server."""

from __future__ import annotations

import pytest
from sqlmodel import select

from deepx_flow.meta.models import Run, Schedule, ScheduleTick
from tests.ui.browser import IDLE, shown_run_id, visit

pytestmark = pytest.mark.slow


def ticks_of(db, schedule=None, status=None):
    query = select(ScheduleTick).order_by(ScheduleTick.tick_at.desc())
    if schedule:
        query = query.where(ScheduleTick.schedule == schedule)
    if status:
        query = query.where(ScheduleTick.status == status)
    with db.read() as s:
        return list(s.exec(query))


def rows(page, css):
    page.wait_for_selector(f".{css} .deepx-grid-row")
    return page.locator(f".{css} .deepx-grid-row")


def test_the_schedule_and_its_launched_tick_are_shown(seeded, dashboard, browser):
    with seeded.db.read() as s:
        schedules = list(s.exec(select(Schedule)))
    assert [s.name for s in schedules] == ["hourly_mean"]
    ticks = ticks_of(seeded.db)
    launched = [t for t in ticks if t.status == "launched"]
    assert len(launched) == 1 and launched[0].run_id
    with seeded.db.read() as s:
        run = s.get(Run, launched[0].run_id)
    page, problems = visit(browser, dashboard, "schedules", "schedules")
    schedule = rows(page, "deepx-schedules").all_inner_texts()
    assert len(schedule) == 1
    for value in ("hourly_mean", "0 * * * *", "feature_mean", "UTC", schedules[0].daemon,
                  str(len(ticks))):
        assert value in schedule[0]
    shown = rows(page, "deepx-ticks").all_inner_texts()
    assert len(shown) == len(ticks)
    row = shown[ticks.index(launched[0])]  # newest tick first
    assert "launched" in row and run.id in row and run.status in row
    assert problems == []


def test_a_ticks_run_links_to_the_run_page(seeded, dashboard, browser):
    run_id = [t for t in ticks_of(seeded.db) if t.status == "launched"][0].run_id
    page, problems = visit(browser, dashboard, "schedules", "schedules-link")
    rows(page, "deepx-ticks")
    page.locator(f".deepx-ticks a:text-is('{run_id}')").click()
    page.wait_for_url(f"**/run?id={run_id}")
    page.wait_for_function(IDLE, timeout=30_000)
    assert shown_run_id(page) == run_id
    assert problems == []


def test_ticks_are_filtered_by_status_and_schedule(seeded, dashboard, browser):
    from playwright.sync_api import expect
    page, problems = visit(browser, dashboard, "schedules?schedule=hourly_mean",
                           "schedules-filtered")
    mine = ticks_of(seeded.db, "hourly_mean")
    assert rows(page, "deepx-ticks").count() == len(mine)
    assert page.locator(".deepx-ticks-schedule select").input_value() == "hourly_mean"
    for status in ("skipped", "launched"):
        want = ticks_of(seeded.db, "hourly_mean", status)
        page.locator(".deepx-ticks-status select").select_option(status)
        status_line = f"rows 1-{len(want)} of {len(want)}" if want else "no rows"
        page.get_by_text(status_line).wait_for()
        expect(page.locator(".deepx-ticks .deepx-grid-row")).to_have_count(len(want))
    assert problems == []
