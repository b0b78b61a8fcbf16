"""The registry page's shell, built without a browser over a real database with two
clusters: a section is built when its tab is first opened; only live clusters are offered
unless the history box is ticked; the cluster chooser shows when several are offered, starts
on the most recently measured one, and choosing the other redraws the link matrix and the
storage tiers (sizes with their unit) for it."""

from __future__ import annotations

import time

import panel as pn
from sqlmodel import col, delete, update

from deepx_flow.meta.models import ChunkPlacement, Link, Worker
from deepx_flow.ui.grid import Grid
from deepx_flow.ui.pages.registry import registry_page
from deepx_flow.ui.registry_reads import MAX_CELLS
from deepx_flow.ui.table import size_text
from deepx_flow.ui.text import Text
from tests.ui.test_registry_reads import ADDRESSES, SCHEDULERS, db  # noqa: F401 (fixture)


def _widget(page, css: str, kind):
    return next(w for w in page.select(kind) if css in w.css_classes)


def _tiers(page) -> list[dict]:
    """The storage tiers table's rows as shown (bytes with their unit: "4.0 KiB")."""
    grid = _widget(page, "deepx-storage-tiers", Grid)
    return [dict(zip(grid.columns, row)) for row in grid.rows]


SECTIONS = ["operators", "network", "placement"]  # the page's tabs, in order


def _open(page, section: str) -> pn.Column:
    """Click a section's tab, as a browser would; its content."""
    [tabs] = page.select(pn.Tabs)
    tabs.active = SECTIONS.index(section)
    return tabs[tabs.active]


def _matrix(page) -> dict:
    figures = [p.object for p in page.select(pn.pane.Bokeh) if p.object is not None]
    source = next(f.select_one({"name": "link-matrix"}) for f in figures
                  if f.select_one({"name": "link-matrix"}) is not None)
    return dict(zip(zip(source.data["source"], source.data["target"]),
                    source.data["status"]))


def test_choosing_a_cluster_redraws_its_links_and_tiers(db):  # noqa: F811
    with db.session() as s:
        s.exec(delete(Link))
        s.exec(delete(ChunkPlacement))
        s.add(Link(scheduler=SCHEDULERS[1], source=ADDRESSES[0], target=ADDRESSES[1],
                   protocol="tcp", bandwidth=1e9, latency=1e-4, measured_at=5.0))
        s.add(Link(scheduler=SCHEDULERS[0], source=ADDRESSES[1], target=ADDRESSES[2],
                   protocol="tcp", bandwidth=2e9, latency=1e-4, measured_at=9.0))
        s.add(ChunkPlacement(run_id="run1", tensor="x@t", chunk="0,0", worker=ADDRESSES[2],
                             tier="host", nbytes=409_600_000, state="memory", updated_at=1.0))
    page = registry_page(db)
    [tabs] = page.select(pn.Tabs)
    assert tabs.active == 0 and tabs[0].objects  # the operators, built
    assert not tabs[1].objects and not tabs[2].objects  # the others when first opened
    _open(page, "network")
    # Both clusters were last seen long ago: none is live, and the history offers them.
    none = _widget(page, "deepx-cluster-none", Text)
    assert none.visible and none.object.startswith("No live cluster: 2 clusters on record")
    _widget(page, "deepx-cluster-history", pn.widgets.Checkbox).value = True
    assert not none.visible
    chooser = _widget(page, "deepx-cluster", pn.widgets.Select)
    assert chooser.visible and chooser.value == SCHEDULERS[0]  # measured last
    assert _matrix(page)[ADDRESSES[1], ADDRESSES[2]] == "measured"
    assert {r["tier"] for r in _tiers(page)} == {"device", "host", "disk"}  # only s1: GPUs
    assert {r["held"] for r in _tiers(page)} == {"0 B"}
    assert {r["status"] for r in _tiers(page)} == {"gone"}
    assert {r["capacity"] for r in _tiers(page)} == {"1.0 GiB", ""}  # disk: not known

    chooser.value = SCHEDULERS[1]
    matrix = _matrix(page)
    assert set(matrix) == {(a, b) for a in ADDRESSES[:2] for b in ADDRESSES[:2]}
    assert matrix[ADDRESSES[0], ADDRESSES[1]] == "measured"
    assert {r["tier"] for r in _tiers(page)} == {"host", "disk"}
    held = {(r["worker"], r["tier"]): r["held"] for r in _tiers(page)}
    assert held.pop((ADDRESSES[2], "host")) == "390.6 MiB" == size_text(409_600_000)
    assert set(held.values()) == {"0 B"}

    # the chunk grid lists the tensor and draws its one chunk
    _open(page, "placement")
    tensor = _widget(page, "deepx-tensor", pn.widgets.Select)
    assert tensor.value == "x@t"


def test_only_live_clusters_and_workers_are_offered_unless_asked(db):  # noqa: F811
    """s2's first two workers are seen now (a driver's heartbeat): s2 alone is offered, with
    only their tiers; the history box brings back s1 and s2's gone worker."""
    now = time.time()
    with db.session() as s:
        s.exec(update(Worker).where(Worker.scheduler == SCHEDULERS[1],
                                    col(Worker.address).in_(ADDRESSES[:2]))
               .values(last_seen=now, status="running"))
    try:
        network = _open(registry_page(db), "network")
        chooser = _widget(network, "deepx-cluster", pn.widgets.Select)
        assert list(chooser.options.values()) == [SCHEDULERS[1]] and not chooser.visible
        assert chooser.value == SCHEDULERS[1]
        assert {(r["worker"], r["status"]) for r in _tiers(network)} == \
            {(a, "running") for a in ADDRESSES[:2]}
        _widget(network, "deepx-cluster-history", pn.widgets.Checkbox).value = True
        assert set(chooser.options.values()) == set(SCHEDULERS) and chooser.visible
        assert chooser.value == SCHEDULERS[1]  # kept
        assert {(r["worker"], r["status"]) for r in _tiers(network)} == \
            {(a, "running") for a in ADDRESSES[:2]} | {(ADDRESSES[2], "gone")}
    finally:
        with db.session() as s:
            s.exec(update(Worker).where(Worker.scheduler == SCHEDULERS[1])
                   .values(last_seen=11.0))


def _grid_and_note(section) -> tuple[list, str]:
    figures = [p.object for p in section.select(pn.pane.Bokeh) if p.object is not None]
    chunks = [c for f in figures if (src := f.select_one({"name": "chunk-grid"})) is not None
              for c in src.data["chunk"]]
    note = next(t for t in section.select(Text) if "deepx-chunk-note" in t.css_classes)
    return chunks, note.object


def _placements(db, tensor: str, chunks) -> None:  # noqa: F811
    """The only placements on record: `tensor`'s, one per chunk index given."""
    with db.session() as s:
        s.exec(delete(ChunkPlacement))
        s.add_all([ChunkPlacement(run_id="run1", tensor=tensor, chunk=c, worker=ADDRESSES[0],
                                  tier="host", nbytes=8, state="memory", updated_at=1.0)
                   for c in chunks])


def test_placements_with_a_malformed_chunk_index_are_named_not_drawn(db):  # noqa: F811
    _placements(db, "m@t", ["0,0", "x,1", "0,1", "-1,0"])  # written by hand, say
    chunks, note = _grid_and_note(_open(registry_page(db), "placement"))
    assert sorted(chunks) == ["0,0", "0,1"]
    assert "2 placements of 2 chunks" in note
    assert "2 placements with a chunk index that is not whole numbers separated by commas " \
        "(the first: 'x,1') not drawn" in note


def test_a_tensor_with_only_malformed_chunks_says_so_and_draws_nothing(db):  # noqa: F811
    _placements(db, "m@t", ["a"])
    chunks, note = _grid_and_note(_open(registry_page(db), "placement"))
    assert chunks == [] and note.startswith("m@t: 1 placement with a chunk index")


def test_a_tensor_with_more_placements_than_drawn_says_how_many(db):  # noqa: F811
    _placements(db, "big@t", [f"0,{i}" for i in range(MAX_CELLS + 5)])
    chunks, note = _grid_and_note(_open(registry_page(db), "placement"))
    assert len(chunks) == MAX_CELLS
    assert f"only the first {MAX_CELLS:,} of {MAX_CELLS + 5:,} placements are read" in note


def test_a_fresh_project_lists_the_installed_operators_as_deepx_flow_ops_does(tmp_path):
    """Nothing registered in the database yet (it said "0 operators"): the operators are
    the installed code's, with the engines this machine has, as `deepx-flow ops` lists
    them; one another installation registered is listed too; measured speeds are shown."""
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    from deepx_flow.meta.models import Operator, OperatorSpeed
    from deepx_flow.registry.operators import (engines_here, installed_engines,
                                               registered_operators)
    from deepx_flow.registry.speeds import speed_table
    db = open_db(f"sqlite:///{tmp_path / 'deepx.db'}")
    try:
        page = registry_page(db)
        registered, installed = registered_operators(), installed_engines()
        assert len(registered) >= 60
        grid = _widget(page, "deepx-operators", Grid)
        rows = [dict(zip(grid.columns, row)) for row in grid.rows]
        by_name = {r.spec.name: r for r in registered}
        assert {r["name"] for r in rows} == set(sorted(by_name)[:len(rows)])  # a page by name
        for row in rows:
            spec = by_name[row["name"]].spec
            assert (row["kind"], row["engines"]) == (spec.kind, engines_here(spec, installed))
        counts = [t.object for t in page.select(Text)
                  if "deepx-operators-count" in t.css_classes]
        assert counts == [f"{len(registered):,} operators"]
        assert any("No operator speeds measured yet" in t.object for t in page.select(Text))
        assert speed_table(db) is None

        with db.session() as s:
            s.add(Operator(name="softplus_elsewhere", kind="elementwise", engines="their_gpu",
                           fusable=True, flops_per_element=4, temp_bytes_per_element=0,
                           source="their-engine", doc="log(1 + exp(x))", registered_at=0.0))
            s.add(OperatorSpeed(operator="matmul", host="h", worker="0", flops=4e9,
                                bytes=1e6, seconds=2.0, tasks=3, updated_at=0.0))
        page = registry_page(db)
        counts = [t.object for t in page.select(Text)
                  if "deepx-operators-count" in t.css_classes]
        assert counts == [f"{len(registered) + 1:,} operators ({len(registered):,} "
                          f"installed here)"]
        grid = _widget(page, "deepx-operators", Grid)
        elsewhere = [dict(zip(grid.columns, r)) for r in grid.rows
                     if r[0] == "softplus_elsewhere"]
        assert [(r["engines"], r["source"]) for r in elsewhere] == [
            ("none here", "their-engine (registered by another installation)")]
        speeds = _widget(page, "deepx-operator-speeds", Grid)
        assert [dict(zip(speeds.columns, r)) for r in speeds.rows] == [
            {"operator": "matmul", "host": "h", "worker": "0", "tasks": 3, "GFLOP/s": "2",
             "GB/s": "0.0005", "updated": "1970-01-01 00:00:00 UTC"}]
        assert "matmul" in speed_table(db)  # what deepx-flow ops lists under the operators
    finally:
        close_all()
