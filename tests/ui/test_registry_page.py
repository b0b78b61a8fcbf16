"""The registry page's shell, built without a browser over a real database with two
clusters: a section is built when its tab is first opened; the cluster chooser shows when
several are on record, starts on the most recently measured one, and choosing the other
redraws the link matrix and the storage tiers for it."""

from __future__ import annotations

import panel as pn
from sqlmodel import delete

from deepx_flow.meta.models import ChunkPlacement, Link
from deepx_flow.ui.grid import Grid
from deepx_flow.ui.pages.registry import registry_page
from deepx_flow.ui.registry_reads import MAX_CELLS
from deepx_flow.ui.text import Text
from tests.ui.test_registry_reads import ADDRESSES, SCHEDULERS, db  # noqa: F401 (fixture)


def _widget(page, css: str, kind):
    return next(w for w in page.select(kind) if css in w.css_classes)


def _tiers(page) -> list[dict]:
    """The storage tiers table's rows as shown (bytes written with thousands commas)."""
    grid = _widget(page, "deepx-storage-tiers", Grid)
    return [dict(zip(grid.columns, row)) for row in grid.rows]


SECTIONS = ["operators", "network", "placement"]  # the page's tabs, in order


def _open(page, section: str) -> pn.Column:
    """Click a section's tab, as a browser would; its content."""
    [tabs] = page.select(pn.Tabs)
    tabs.active = SECTIONS.index(section)
    return tabs[tabs.active]


def _held(row) -> int:
    return int(row["held"].replace(",", ""))


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
                             tier="host", nbytes=4096, state="memory", updated_at=1.0))
    page = registry_page(db)
    [tabs] = page.select(pn.Tabs)
    assert tabs.active == 0 and tabs[0].objects  # the operators, built
    assert not tabs[1].objects and not tabs[2].objects  # the others when first opened
    _open(page, "network")
    chooser = _widget(page, "deepx-cluster", pn.widgets.Select)
    assert chooser.visible and chooser.value == SCHEDULERS[0]  # measured last
    assert _matrix(page)[ADDRESSES[1], ADDRESSES[2]] == "measured"
    assert {r["tier"] for r in _tiers(page)} == {"device", "host", "disk"}  # only s1: GPUs
    assert sum(_held(r) for r in _tiers(page)) == 0

    chooser.value = SCHEDULERS[1]
    matrix = _matrix(page)
    assert set(matrix) == {(a, b) for a in ADDRESSES[:2] for b in ADDRESSES[:2]}
    assert matrix[ADDRESSES[0], ADDRESSES[1]] == "measured"
    assert {r["tier"] for r in _tiers(page)} == {"host", "disk"}
    held = {(r["worker"], r["tier"]): _held(r) for r in _tiers(page)}
    assert held[ADDRESSES[2], "host"] == 4096 and sum(held.values()) == 4096

    # the chunk grid lists the tensor and draws its one chunk
    _open(page, "placement")
    tensor = _widget(page, "deepx-tensor", pn.widgets.Select)
    assert tensor.value == "x@t"


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
