"""The dashboard as a new user first sees it, in a real browser: a project folder where one
script (tests/ui/new_user_script.py, its own process) trained a model with a checkpoint and
a held-out set, trained another without one, and predicted; then exited, its embedded
cluster gone. The dashboard is served without `--scheduler`, over the default database the
script made, where nothing was registered by hand (issue 30, item 12):

a. the registry lists the operators the installed code has, as `deepx-flow ops` does, and
   the speeds measured of them (it said "0 operators");
b. the overview shows the latest runs and the last cluster on record (it was empty);
c. a training run's page: no task before the run's start (its timeline began at -7 s), an
   input credited only its own compute (6.86 s in a 0.35 s run), every task naming what it
   ran (a grouped step was "?"), constants as the shortest text of their value (not
   0.09999999999999998), the held-out loss drawn, and listed only when there is one;
d. the graph page draws the whole graph, reached by scrolling (it was cut off at the right
   edge), its boxes named as the user named the nodes (not by hashes).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlmodel import select

from deepx_flow.meta.models import GraphRecord, Run
from deepx_flow.meta.queries import list_runs, run_tasks, task_summary
from deepx_flow.spec.yaml_io import from_yaml
from deepx_flow.ui.graph_picture import ANONYMOUS_ID
from tests.helpers import free_port
from tests.ui.browser import page_text, screenshot, visit
from tests.ui.conftest import browser_or_skip
from tests.ui.test_browser_graph import data

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("new_user_script.py")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The folder the script ran in (`folder`), its database (`url`, `db`), the first
    training's id, and a dashboard serving the database with no scheduler (`base`)."""
    browser_or_skip()
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    from deepx_flow.ui.server import serve
    from tests.ui.test_server import wait_until_serving
    folder = tmp_path_factory.mktemp("new-user")
    # A new user's environment: no database, asset root or scheduler set, so the defaults
    # (under the folder) are what the script uses.
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEEPX_DB_URL", "DEEPX_ASSET_ROOT", "DEEPX_SCHEDULER")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    url = f"sqlite:///{folder / '.deepx' / 'deepx.db'}"
    db = open_db(url)
    port = free_port()
    server = serve(db=url, port=port, threaded=True)
    try:
        wait_until_serving(port)
        yield SimpleNamespace(folder=folder, url=url, db=db, base=f"http://127.0.0.1:{port}",
                              training=done.stdout.split()[-1])
    finally:
        server.stop()
        close_all()


@pytest.fixture(scope="module")
def browser(project, chromium):
    """The shared browser (`conftest.chromium`), without the seeded dashboard."""
    return chromium


def cells(page, css: str, field: str) -> list[str]:
    page.wait_for_selector(f".{css} .deepx-grid-row")
    return [t.strip() for t in page.locator(f".{css} td[data-field='{field}']")
            .all_inner_texts()]


def train_runs(db, training: str | None = None) -> list[Run]:
    """The runs of kind train (of `training`, if given), oldest first."""
    runs = [r for r in list_runs(db, limit=1000) if r.kind == "train"
            and (training is None or r.training_id == training)]
    return sorted(runs, key=lambda r: r.started_at)


# --- a. the registry ---------------------------------------------------------------------

def test_the_registry_lists_the_installed_operators_as_ops_does(project, browser):
    from deepx_flow.cli.main import main
    from deepx_flow.registry.operators import registered_operators
    from deepx_flow.registry.speeds import measured_speeds
    from deepx_flow.ui.pages.registry import OPERATORS_PAGE
    registered = registered_operators()
    page, problems = visit(browser, project.base, "registry", "new-user-registry")
    assert f"{len(registered):,} operators" in page_text(page)
    names = cells(page, "deepx-operators", "name")
    assert names == sorted(r.spec.name for r in registered)[:OPERATORS_PAGE]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ops", "--db", project.url]) == 0
    listed = {line.split()[0] for line in out.getvalue().splitlines() if line.strip()}
    assert set(names) <= listed  # what `deepx-flow ops` lists
    # The speeds the project's runs measured, as ops lists them under the operators.
    speeds = measured_speeds(project.db)
    if speeds:
        assert cells(page, "deepx-operator-speeds", "operator") == \
            [s.operator for s in speeds][:50]
        assert all(s.operator in out.getvalue() for s in speeds)
    else:
        assert "No operator speeds measured yet" in page_text(page)
    assert problems == []


# --- b. the overview ---------------------------------------------------------------------

def test_the_overview_shows_the_latest_runs_and_the_last_cluster(project, browser):
    from deepx_flow.meta.models import Worker
    from deepx_flow.ui.pages.overview import PAGE_SIZE
    runs = list_runs(project.db, limit=PAGE_SIZE)
    with project.db.read() as s:
        workers = sorted(s.exec(select(Worker.address).where(
            Worker.scheduler == runs[0].scheduler)))
    page, problems = visit(browser, project.base, "", "new-user-overview")
    assert cells(page, "deepx-overview-latest-runs", "id") == [r.id for r in runs]
    assert cells(page, "deepx-overview-latest-runs", "kind")[0] == "run"  # the prediction
    assert cells(page, "deepx-overview-workers", "worker") == workers
    assert set(cells(page, "deepx-overview-workers", "state")) == {"gone"}
    assert f"the last cluster on record is shown, {runs[0].scheduler}" in page_text(page)
    assert problems == []


# --- c. a training run's page ------------------------------------------------------------

TIMELINE_OPERATORS = """() => {
  const args = Bokeh.documents[0].get_model_by_name('timeline-operators').args;
  return Array.from(args instanceof Map ? args.get('names') : args.names);
}"""
LEGEND = """() => Bokeh.documents[0].get_model_by_name('loss-legend').items
                 .map((item) => [item.label.value, item.visible])"""


def test_a_training_runs_page_shows_its_tasks_as_they_ran(project, browser):
    runs = train_runs(project.db, project.training)
    assert len(runs) == 4  # 20 steps, 5 to a graph: one learning rate's key in all four
    for i, run in enumerate(runs):
        page, problems = visit(browser, project.base, f"run?id={run.id}", f"new-user-run-{i}")
        lefts = data(page, "timeline-source")["left"]
        tasks = [t for t in run_tasks(project.db, run.id) if t.start is not None]
        assert len(lefts) == len(tasks) and min(lefts) >= 0.0  # none before the run
        operators = page.evaluate(TIMELINE_OPERATORS)
        shown = cells(page, "deepx-run-operators", "operator")
        assert "?" not in operators and "?" not in shown
        assert any(o.startswith("group[") for o in shown)  # the grouped steps, named
        compute = dict(zip(shown, cells(page, "deepx-run-operators", "compute s")))
        duration = run.ended_at - run.started_at
        assert float(compute["input"]) < duration / 2
        assert {row[0] for row in task_summary(project.db, run.id)} == set(shown)
        text = page_text(page)
        # Adam's 1 - 0.9 and 1 - 0.999 in float32: 0.1 and 0.001 as the kernels use them.
        assert "mul(0.1, " in text and "mul(0.001, " in text
        assert "0.0999" not in text and "0.00100000" not in text
        assert page.evaluate(LEGEND) == [["training loss", True], ["held-out loss", True]]
        assert problems == []
    assert len(data(page, "eval-loss-source")["step"]) == 4  # every 5 steps of 20


def test_a_training_without_held_out_data_lists_no_held_out_loss(project, browser):
    (run,) = [r for r in train_runs(project.db) if r.training_id != project.training]
    page, problems = visit(browser, project.base, f"run?id={run.id}", "new-user-run-no-eval")
    assert page.evaluate(LEGEND) == [["training loss", True], ["held-out loss", False]]
    assert problems == []


# --- d. the graph page -------------------------------------------------------------------

def graph_view(page) -> dict:
    """The picture's scrolling frame: its width, the width it scrolls over, and the page's
    and the window's."""
    frame = page.locator(".deepx-graph-view").first
    sizes = frame.evaluate("(e) => ({client: e.clientWidth, scroll: e.scrollWidth})")
    return {**sizes, **page.evaluate("() => ({page: document.documentElement.scrollWidth,"
                                     " window: window.innerWidth})")}


def test_the_graph_page_draws_the_whole_graph_with_the_users_names(project, browser):
    run = train_runs(project.db, project.training)[0]
    with project.db.read() as s:
        graph = from_yaml(s.get(GraphRecord, run.graph_hash).yaml)
    page, problems = visit(browser, project.base, f"graph?run={run.id}", "new-user-graph")
    nodes = data(page, "graph-nodes")
    assert len(nodes["id"]) == len(graph.nodes)
    name = dict(zip(nodes["id"], nodes["name"]))
    outputs = dict(graph.outputs)
    assert name[outputs["loss"]] == "loss" and name[outputs["grad_norm"]] == "grad_norm"
    # Hashes only for nodes the user did not name: no named output shows one.
    for out, node in graph.outputs:
        assert not ANONYMOUS_ID.match(name[node]), (out, name[node])
    # The whole graph is in the figure; the page stays as wide as the window, and the frame
    # scrolls over all of the figure.
    fig = page.evaluate("""() => {
        const f = Bokeh.documents[0].get_model_by_name('graph');
        return {start: f.x_range.start, end: f.x_range.end, width: f.width};
    }""")
    assert fig["start"] < min(nodes["x"]) and max(nodes["x"]) < fig["end"]
    view = graph_view(page)
    assert view["page"] <= view["window"]
    assert view["client"] < fig["width"] <= view["scroll"]  # wider than the page: scrolled
    frame = page.locator(".deepx-graph-view").first
    frame.evaluate("(e) => { e.scrollLeft = e.scrollWidth; }")
    screenshot(page, "new-user-graph-scrolled")
    assert problems == []
