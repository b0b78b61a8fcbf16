"""The graph page in a real browser, over the seeded database (tests/ui/conftest.py): no
JavaScript error, no request off the server; the compiled graph of a run has one box per
node of its recorded graph, its fused kernel framed under the name its tasks were recorded
with, and chunk grids that add up to the chunks the run recorded; the lineage (its tab,
opened by a click or by the URL) shows every seeded asset coloured as the staleness rule and
`dx.status` say.

The last test materializes `features` again (a new version and a new run in the shared
database), so `feature_mean` turns stale; it runs last in this module, and no other module
counts asset versions.
"""

from __future__ import annotations

import math

import pytest

import deepx_flow as dx
from deepx_flow.meta.models import GraphRecord
from deepx_flow.meta.queries import list_runs, task_summary
from deepx_flow.spec.yaml_io import from_yaml
from deepx_flow.ui import lineage
from deepx_flow.ui.asset_versions import newest_versions
from tests.ui.browser import page_text, visit

pytestmark = pytest.mark.slow


def data(page, source: str) -> dict:
    """The columns of a named Bokeh data source on the page."""
    return page.evaluate(f"""() => {{
        const data = Bokeh.documents[0].get_model_by_name('{source}').data;
        const out = {{}};
        for (const [k, v] of (data instanceof Map ? data.entries() : Object.entries(data)))
            out[k] = Array.from(v);
        return out;
    }}""")


def first_dx_run(db):
    """The seed's `dx.run` of tanh(x) * 2 summed: the oldest run of kind "run"."""
    return [r for r in list_runs(db, limit=1000) if r.kind == "run"][-1]


def recorded_graph(db, run):
    with db.read() as session:
        return session.get(GraphRecord, run.graph_hash)


def test_the_compiled_graph_has_a_box_per_node(seeded, dashboard, browser):
    run = first_dx_run(seeded.db)
    record = recorded_graph(seeded.db, run)
    graph = from_yaml(record.yaml)  # the project's own loader, on the text the run recorded
    assert len(graph.nodes) == record.n_nodes == 5  # random, tanh, 2.0, mul, sum
    page, problems = visit(browser, dashboard, f"graph?run={run.id}", "graph")
    nodes = data(page, "graph-nodes")
    assert sorted(nodes["id"]) == sorted(n.id for n in graph.nodes)
    assert sorted(nodes["op"]) == sorted(n.op for n in graph.nodes)
    # One edge per distinct (operand, user) pair of the graph.
    edges = data(page, "graph-edges")
    assert sorted(zip(edges["source"], edges["target"])) == sorted(
        {(src, n.id) for n in graph.nodes for src in n.inputs})
    # The fused kernel (tanh, mul and the constant folded into the sum) is one framed group,
    # named as the run's task rows name its operator.
    groups = data(page, "graph-groups")
    operators = {op for op, *_ in task_summary(seeded.db, run.id)}
    assert groups["members"] == [4]
    assert groups["name"][0] in operators and groups["name"][0].startswith("sum+prologue")
    grouped = [op for op, group in zip(nodes["op"], nodes["group"]) if group]
    assert sorted(grouped) == ["full", "mul", "sum", "tanh"]
    # Boxes of the kernels give their chunk grid; together they make the run's chunks.
    grids = [c for c in nodes["chunks"] if c.endswith(("chunk", "chunks"))]
    assert len(grids) == 2  # random_normal and the sum with its prologue
    counts = [math.prod(int(n) for n in c.split()[0].split("x")) for c in grids]
    assert sum(counts) == run.n_chunks
    text = page_text(page)
    assert run.id in text and "The plan the run recorded" in text
    assert "Plan for cluster" in text  # the recorded explain text
    assert problems == []


def test_without_a_run_it_shows_the_latest(seeded, dashboard, browser):
    latest = list_runs(seeded.db, limit=1)[0]
    record = recorded_graph(seeded.db, latest)
    page, problems = visit(browser, dashboard, "graph", "graph-latest")
    assert f"run {latest.id}" in page_text(page)
    if record is not None and record.yaml:
        assert len(data(page, "graph-nodes")["id"]) == record.n_nodes
    else:  # a run another module's test wrote without its graph's YAML, still there
        text = page_text(page)
        assert "without its YAML" in text or "not in the graphs table" in text
    assert problems == []


def test_an_unknown_run_says_so(dashboard, browser):
    page, problems = visit(browser, dashboard, "graph?run=nosuchrun", "graph-unknown")
    assert "no run 'nosuchrun'" in page_text(page)
    page.get_by_text("Asset lineage", exact=True).click()  # the lineage is still drawn
    page.wait_for_function(LINEAGE_DRAWN)
    assert len(data(page, "lineage-nodes")["asset"]) >= 3
    assert problems == []


def test_a_run_argument_that_looks_like_markup_is_shown_as_typed(dashboard, browser):
    page, problems = visit(browser, dashboard, "graph?run=%3Ci%20id%3Dinjected%3Ex%3C/i%3E",
                           "graph-injected")
    assert "no run '<i id=injected>x</i>'" in page_text(page)
    assert page.locator("#injected").count() == 0
    assert problems == []


LINEAGE_DRAWN = "() => Bokeh.documents[0].get_model_by_name('lineage-nodes') !== null"


def shown_lineage(seeded, dashboard, browser, shot: str) -> dict:
    page, problems = visit(browser, dashboard, "graph?section=lineage", shot)
    assert problems == []
    nodes = data(page, "lineage-nodes")
    return {a: (state, color) for a, state, color in
            zip(nodes["asset"], nodes["state"], nodes["color"])}


def expected_lineage(seeded) -> dict:
    states = lineage.asset_states(*newest_versions(seeded.db)[:2])
    status = dx.status(seeded.defs, db=seeded.db)
    for name in seeded.defs.order:  # the rows tell what dx.status says
        assert states[name].stale == status[name].stale, (name, status)
    return states


def test_the_lineage_shows_every_asset_fresh(seeded, dashboard, browser):
    shown = shown_lineage(seeded, dashboard, browser, "graph-lineage")
    states = expected_lineage(seeded)
    assert set(shown) == set(seeded.defs.order) == {"features", "feature_mean", "daily"}
    assert shown == {a: (s.state, lineage.STATE_COLORS[s.state]) for a, s in states.items()}
    assert all(state == lineage.FRESH for state, _ in shown.values())


def test_a_new_upstream_version_makes_its_reader_stale(seeded, dashboard, browser):
    """Changes the shared database: a new version of `features` (and its run)."""
    dx.materialize(seeded.defs, "features", client=seeded.client, db=seeded.url)
    shown = shown_lineage(seeded, dashboard, browser, "graph-lineage-stale")
    states = expected_lineage(seeded)
    assert states["feature_mean"].state == lineage.STALE
    assert shown["feature_mean"] == (lineage.STALE, lineage.STATE_COLORS[lineage.STALE])
    assert shown["features"][0] == shown["daily"][0] == lineage.FRESH
