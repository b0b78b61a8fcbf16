"""The dashboard's finish, in a real browser over the seeded database (tests/ui/conftest.py):
sizes written with their unit, no pager under a table that fits on one page, long cells cut
and readable in full, a materialization's run page naming the assets and checks its
outputs stored, node ids in the graph's boxes, arrows on the lineage's edges, the loss
curve on every graph of a training, and every page served under a Content-Security-Policy
that forbids framing, with nothing broken by it."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import quote

import pytest
from sqlmodel import col, select

from deepx_flow.meta.models import (AssetCheckResult, AssetMaterialization, Event, Run,
                                    Task)
from deepx_flow.meta.queries import list_runs, task_summary
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.spec.yaml_io import from_yaml
from deepx_flow.ui.graph_picture import id_text
from deepx_flow.ui.pages import PATHS
from deepx_flow.ui.server import HEADERS
from tests.helpers import remove_runs
from tests.ui.browser import figure_box, page_text, visit
from tests.ui.test_browser_graph import data, first_dx_run, recorded_graph

pytestmark = pytest.mark.slow


def cells(page, css: str, field: str) -> list[str]:
    page.wait_for_selector(f".{css} .deepx-grid-row")
    return [t.strip() for t in page.locator(f".{css} td[data-field='{field}']")
            .all_inner_texts()]


def facts(page, css: str = "deepx-run-facts") -> dict:
    return dict(zip(cells(page, css, "what"), cells(page, css, "value")))


# --- 1. sizes with their unit -------------------------------------------------------------

def test_sizes_are_written_with_their_unit(seeded, dashboard, browser):
    run = first_dx_run(seeded.db)
    summary = task_summary(seeded.db, run.id)
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "polish-bytes-run")
    shown = dict(zip(cells(page, "deepx-run-operators", "operator"),
                     cells(page, "deepx-run-operators", "bytes out")))
    assert shown == {row[0]: format_bytes(row[5]) for row in summary}
    assert any(row[5] >= 1024 for row in summary)  # a size that was an integer of bytes
    assert all(text.endswith(("B", "KiB", "MiB", "GiB")) for text in shown.values())

    with seeded.db.read() as s:
        versions = list(s.exec(select(AssetMaterialization)
                               .where(AssetMaterialization.asset == "features")
                               .order_by(col(AssetMaterialization.created_at).desc(),
                                         col(AssetMaterialization.id).desc())))
    page, more = visit(browser, dashboard, "assets?asset=features", "polish-bytes-asset")
    assert cells(page, "deepx-asset-versions", "bytes") == [format_bytes(v.nbytes)
                                                             for v in versions]
    assert facts(page, "deepx-asset-facts")["bytes"] == format_bytes(versions[0].nbytes) \
        == "12.5 KiB"  # 200 x 16 float32
    assert problems == more == []


# --- 2. no pager under a table that fits on one page ------------------------------------

def pager_shown(page, css: str) -> tuple[bool, bool]:
    """(whether the table's pager is visible, whether its buttons are)."""
    return (page.locator(f".{css} .deepx-grid-pager").is_visible(),
            page.locator(f".{css} .deepx-grid-next").is_visible())


def test_a_table_that_fits_on_one_page_has_no_pager(seeded, dashboard, browser):
    run = first_dx_run(seeded.db)
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "polish-pager")
    for css in ("deepx-run-facts", "deepx-run-operators"):  # tables that do not page
        page.wait_for_selector(f".{css} .deepx-grid-row")
        assert pager_shown(page, css) == (False, False), css
    assert pager_shown(page, "deepx-run-outputs") == (True, False)  # one page of outputs
    # An empty table says so, with no buttons.
    assert page.locator(".deepx-run-events .deepx-grid-status").inner_text() == "no rows"
    assert pager_shown(page, "deepx-run-events") == (True, False)
    # A paged table of one page: how many rows it has, and no buttons.
    listed, more = visit(browser, dashboard, "runs", "polish-pager-runs")
    listed.wait_for_selector(".deepx-runs .deepx-grid-row")
    n = len(list_runs(seeded.db, limit=100))
    assert n < 50 and pager_shown(listed, "deepx-runs") == (True, False)
    assert listed.locator(".deepx-runs .deepx-grid-status").inner_text() == f"rows 1-{n} of {n}"
    assert problems == more == []


def test_a_table_of_several_pages_keeps_its_pager(seeded, dashboard, browser):
    """25 events of a run (recorded as a driver would), 20 a page: the buttons show, and
    the last page has the other 5."""
    from playwright.sync_api import expect
    run = first_dx_run(seeded.db)
    run_id = uuid.uuid4().hex
    with seeded.db.session() as session:
        session.add(Run(id=run_id, graph_hash=run.graph_hash, status="succeeded",
                        started_at=time.time(), ended_at=time.time(), scheduler="test",
                        cluster="test", n_workers=1, n_tasks=0, n_chunks=0, host="h", pid=1,
                        username="test"))
        session.flush()
        session.add_all([Event(run_id=run_id, at=1.0 + i, kind="drift", message=f"e{i}")
                         for i in range(25)])
    try:
        page, problems = visit(browser, dashboard, f"run?id={run_id}", "polish-pager-paged")
        page.wait_for_selector(".deepx-run-events .deepx-grid-row")
        assert pager_shown(page, "deepx-run-events") == (True, True)
        assert page.locator(".deepx-run-events .deepx-grid-status").inner_text() == \
            "rows 1-20 of 25"
        page.locator(".deepx-run-events .deepx-grid-last").click()
        expect(page.locator(".deepx-run-events .deepx-grid-status")).to_have_text(
            "rows 21-25 of 25")
        assert problems == []
    finally:
        remove_runs(seeded.db, run_id)


# --- 3. long cells ------------------------------------------------------------------------

def test_a_long_cell_is_cut_and_shown_whole_on_hover_and_click(seeded, dashboard, browser):
    [failed] = list_runs(seeded.db, status="failed", limit=1000)
    assert len(failed.error) > 150
    page, problems = visit(browser, dashboard, "runs", "polish-long-cell")
    page.wait_for_selector(".deepx-runs .deepx-grid-row")
    cell = page.locator(".deepx-runs .deepx-grid-row").filter(has_text=failed.id) \
        .locator("td[data-field='error']")
    measure = "td => [td.scrollWidth, td.clientWidth, getComputedStyle(td).textOverflow]"
    full, shown, overflow = cell.evaluate(measure)
    assert full > shown and overflow == "ellipsis"  # cut, with an ellipsis
    assert cell.get_attribute("title") is None
    cell.hover()
    assert cell.get_attribute("title") == failed.error  # the whole text, on hover
    height = cell.bounding_box()["height"]
    cell.click()
    full, shown, _ = cell.evaluate(measure)
    assert full <= shown and cell.bounding_box()["height"] > 2 * height  # opened, wrapped
    assert " ".join(failed.error.split()) in " ".join(cell.inner_text().split())
    cell.click()
    assert cell.evaluate(measure)[0] > cell.evaluate(measure)[1]  # closed again
    assert problems == []


# --- 4. a materialization's outputs are named by the assets they stored -----------------

def test_a_materializations_run_page_names_its_assets_and_checks(seeded, dashboard, browser):
    runs = [r for r in list_runs(seeded.db, limit=1000) if r.kind == "materialize"]
    assert runs
    seen_checks = set()
    for run in runs:
        with seeded.db.read() as s:
            stored = list(s.exec(select(AssetMaterialization)
                                 .where(AssetMaterialization.run_id == run.id)
                                 .order_by(col(AssetMaterialization.id))))
            checks = {m.id: [c.check for c in s.exec(
                select(AssetCheckResult).where(AssetCheckResult.materialization_id == m.id)
                .order_by(col(AssetCheckResult.id)))] for m in stored}
        page, problems = visit(browser, dashboard, f"run?id={run.id}", "polish-outputs")
        outputs = cells(page, "deepx-run-outputs", "output")
        assets = cells(page, "deepx-run-outputs", "asset")
        named = cells(page, "deepx-run-outputs", "check")
        versions = cells(page, "deepx-run-outputs", "version")
        # Every stored version is named by its asset, next to its output t<i>.
        targets = {o: (a, v) for o, a, v, c in zip(outputs, assets, versions, named)
                   if not c}
        assert targets == {f"t{i}": (m.asset, m.version) for i, m in enumerate(stored)}
        # Every measured check by its name, with the asset it checked.
        for o, a, c in zip(outputs, assets, named):
            if c:
                i, j = int(o[1:].split("_")[0]), int(o.split("_check")[1].split("_")[0])
                assert (a, c) == (stored[i].asset, checks[stored[i].id][j])
                seen_checks.add(c)
        text = page_text(page)
        assert all(m.asset in text for m in stored)
        links = page.locator(".deepx-run-outputs td[data-field='asset'] a")
        assert set(links.all_inner_texts()) == {m.asset for m in stored}
        assert problems == []
    assert "all_finite" in seen_checks  # `features`' check, which measures on the cluster


# --- 5. node ids in the graph's boxes -----------------------------------------------------

def test_graph_boxes_name_their_nodes_as_the_plan_does(seeded, dashboard, browser):
    run = first_dx_run(seeded.db)
    graph = from_yaml(recorded_graph(seeded.db, run).yaml)
    page, problems = visit(browser, dashboard, f"graph?run={run.id}", "polish-graph-ids")
    nodes = data(page, "graph-nodes")
    assert [t.split("\n")[0] for t in nodes["text"]] == [id_text(i) for i in nodes["id"]]
    assert sorted(nodes["id"]) == sorted(n.id for n in graph.nodes)
    # The ids the recorded plan's tables name are the boxes' (those it has: fused nodes).
    plan = page_text(page).split("The plan the run recorded", 1)[1]
    named = [i for i in nodes["id"] if i in plan]
    assert len(named) >= 2 and all(id_text(i) == i for i in named)
    assert problems == []


# --- 6. arrows on the lineage -------------------------------------------------------------

def test_lineage_edges_are_arrows_from_upstream_to_reader(seeded, dashboard, browser):
    page, problems = visit(browser, dashboard, "graph?section=lineage", "polish-lineage")
    page.wait_for_function("() => Bokeh.documents[0].get_model_by_name('lineage-arrows')")
    edges = data(page, "lineage-edges")
    assert list(zip(edges["source"], edges["target"])) == [("features", "feature_mean")]
    arrow = page.evaluate("""() => {
        const a = Bokeh.documents[0].get_model_by_name('lineage-arrows');
        return [a.type, a.end === null ? null : a.end.type, a.start, a.source.name];
    }""")
    assert arrow == ["Arrow", "VeeHead", None, "lineage-edges"]  # a head at the reader only
    nodes = data(page, "lineage-nodes")
    at = dict(zip(nodes["asset"], nodes["x"]))
    assert edges["x_start"][0] > at["features"] and edges["x_end"][0] < at["feature_mean"]
    assert problems == []


# --- 8. the loss curve on every graph of a training --------------------------------------

def test_every_graph_of_a_training_shows_its_loss_curve(seeded, dashboard, browser):
    fit = seeded.fit
    with seeded.db.read() as s:
        runs = list(s.exec(select(Run.id).where(Run.training_id == fit.training_id)
                           .order_by(col(Run.started_at))))
    assert len(runs) >= 2  # 12 steps, at most 6 a graph (cut where it is evaluated)
    listed, problems = visit(browser, dashboard, "runs", "polish-loss-runs")
    listed.wait_for_selector(".deepx-runs .deepx-grid-row")
    for run_id in runs:
        listed.goto(f"{dashboard}/runs")
        listed.wait_for_selector(f".deepx-runs a:text('{run_id}')")
        listed.locator(f".deepx-runs a:text('{run_id}')").click()  # as a user gets there
        listed.wait_for_url(f"**/run?id={run_id}")
        listed.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0 && "
                                 "Bokeh.documents[0].is_idle", timeout=30_000)
        assert listed.evaluate("() => Bokeh.documents[0].get_model_by_name('loss-source')"
                               ".data['step'].length") == fit.steps
        box = figure_box(listed, "loss-curve")  # drawn, at its size
        assert box is not None and box["width"] > 300 and box["height"] > 150
    assert problems == []


# --- 9. a Content-Security-Policy on every page -------------------------------------------

def every_page(seeded) -> list[str]:
    run = first_dx_run(seeded.db)
    return ([p for p in PATHS if p != "run"] + [f"run?id={run.id}", "graph?section=lineage",
             "assets?asset=features", "registry?section=network",
             "schedules?schedule=hourly_mean", f"graph?run={run.id}"])


def test_every_response_carries_the_security_headers(seeded, dashboard):
    paths = every_page(seeded) + ["static/js/bokeh.min.js", "no/such/page"]
    for path in paths:
        try:
            response = urllib.request.urlopen(f"{dashboard}/{path}", timeout=30)
        except urllib.error.HTTPError as err:  # a 404 carries them too
            response = err
        for name, value in HEADERS.items():
            assert response.headers.get(name) == value, (path, name)
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_every_page_works_under_the_policy(seeded, dashboard, browser):
    for path in every_page(seeded):
        page, problems = visit(browser, dashboard, path, "polish-csp-" + quote(path, safe=""))
        assert problems == [], path  # a blocked script, style or socket is a console error
        page.close()
    # Bokeh's own code under the policy: hovering over the timeline's widest bar runs its
    # hover's formatter (a CustomJSHover, which Bokeh compiles) and names the operator.
    run = first_dx_run(seeded.db)
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "polish-csp-hover")
    from playwright.sync_api import expect
    x, y, key = page.evaluate(WIDEST_BAR)
    page.mouse.move(x, y)
    with seeded.db.read() as s:
        operator = s.exec(select(Task.operator).where(Task.run_id == run.id,
                                                      Task.key == key)).one()
    tip = page.locator(".bk-tooltip-content").filter(has_text=key)
    expect(tip).to_contain_text(operator)  # looked up by the compiled formatter
    assert problems == []


# Where the timeline's widest bar is on the screen, and its key (Bokeh's view of the figure
# maps data to canvas pixels).
WIDEST_BAR = """() => {
  const doc = Bokeh.documents[0];
  const figure = doc.get_model_by_name('timeline');
  const d = doc.get_model_by_name('timeline-source').data;
  let best = 0;
  for (let i = 0; i < d.left.length; i++)
    if (d.right[i] - d.left[i] > d.right[best] - d.left[best]) best = i;
  const views = [];
  const walk = (v) => { views.push(v); for (const c of v.child_views ?? []) walk(c); };
  for (const v of Object.values(Bokeh.index)) walk(v);
  const view = views.find((v) => v.model === figure);
  const box = view.canvas_view.el.getBoundingClientRect();
  return [box.left + view.frame.x_scale.compute((d.left[best] + d.right[best]) / 2),
          box.top + view.frame.y_scale.compute(d.lane[best]), d.key[best]];
}"""


def test_no_site_may_frame_the_dashboard(seeded, dashboard, browser):
    """A page of another origin that frames the dashboard gets nothing: the browser refuses
    to render it (frame-ancestors 'none'; X-Frame-Options DENY for older browsers)."""
    page = browser.new_page()
    refused = []
    page.on("console", lambda m: refused.append(m.text) if "frame" in m.text.lower() else None)
    page.set_content(f'<iframe id="f" src="{dashboard}/runs" width="800" height="600"></iframe>')
    page.wait_for_timeout(2000)
    frame = page.frame_locator("#f")
    assert frame.locator(".deepx-runs").count() == 0
    assert refused and any("frame-ancestors" in t or "X-Frame-Options" in t for t in refused)
    page.close()
