"""The registry page in a real browser, over the seeded database (tests/ui/conftest.py): no
JavaScript error and no request off the server; every registered operator listed; a click on
the network tab draws the link matrix with the bandwidths the probe measured and each
worker's storage tiers with the bytes its chunks hold; and the persisted tensor's chunk grid
has a cell per placement, coloured by the worker the database names."""

from __future__ import annotations

import re
from collections import defaultdict
from urllib.parse import quote

import pytest
from sqlmodel import func, select

from deepx_flow.meta.models import Link, Operator, Run, StorageTier, Worker
from deepx_flow.meta.queries import placements
from deepx_flow.ui.chunk_grid import worker_colors
from deepx_flow.ui.registry_reads import HELD, SHOWN
from deepx_flow.ui.table import size_text
from tests.ui.browser import page_text, screenshot, visit

pytestmark = pytest.mark.slow

LINKS = """() => {
  const d = Bokeh.documents[0].get_model_by_name('link-matrix').data;
  return Array.from(d.status, (s, i) =>
    [d.source[i], d.target[i], s, s === 'measured' ? d.bandwidth[i] : null,
     s === 'measured' ? d.latency_ms[i] : null]);
}"""
MATRIX_DRAWN = "() => Bokeh.documents[0].get_model_by_name('link-matrix') !== null"
GRID = """() => {
  const d = Bokeh.documents[0].get_model_by_name('chunk-grid').data;
  return Array.from(d.chunk, (c, i) => [c, d.worker[i], d.state[i], d.color[i]]);
}"""

# Elements with id "injected", looked for through Panel's shadow roots.
FIND_INJECTED = """() => {
  let found = 0;
  const walk = (node) => {
    if (node.id === 'injected') found += 1;
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.children || []) walk(child);
  };
  walk(document.body);
  return found;
}"""


def _cells(page, css: str, field: str) -> list[str]:
    return page.locator(f".{css} td[data-field='{field}']").all_inner_texts()


def test_the_registry_shows_operators_links_and_storage(seeded, dashboard, browser):
    with seeded.db.read() as s:
        n_operators = s.exec(select(func.count()).select_from(Operator)).one()
        links = s.exec(select(Link).where(Link.scheduler == seeded.scheduler)).all()
        tiers = s.exec(select(Worker.address, StorageTier.tier)
                       .join(StorageTier, StorageTier.worker_id == Worker.id)
                       .where(Worker.scheduler == seeded.scheduler)).all()
        runs = set(s.exec(select(Run.id).where(Run.scheduler == seeded.scheduler)).all())
    assert n_operators > 20 and len(links) == 2 and tiers

    page, problems = visit(browser, dashboard, "registry", "registry")
    page.wait_for_selector(".deepx-operators .deepx-grid-row")
    assert f"{n_operators:,} operators" in page_text(page)
    from deepx_flow.ui.pages.registry import OPERATORS_PAGE
    assert len(_cells(page, "deepx-operators", "name")) == min(n_operators, OPERATORS_PAGE)
    assert page.locator(".deepx-storage-tiers").count() == 0  # not built until opened

    page.get_by_text("Network and storage", exact=True).click()
    page.wait_for_selector(".deepx-storage-tiers .deepx-grid-row")
    page.wait_for_function(MATRIX_DRAWN)
    screenshot(page, "registry-network")
    assert f"cluster: scheduler {seeded.scheduler}" in page_text(page)

    # the matrix: both workers each way, the measured cells carry the rows' numbers
    shown = page.evaluate(LINKS)
    workers = sorted({x.source for x in links} | {x.target for x in links})
    assert [(a, b) for a, b, *_ in shown] == [(a, b) for a in workers for b in workers]
    measured = {(a, b): (bw, lat) for a, b, status, bw, lat in shown if status == "measured"}
    assert measured.keys() == {(x.source, x.target) for x in links}
    for x in links:
        assert measured[x.source, x.target] == pytest.approx((x.bandwidth, x.latency * 1e3))
    assert {status for a, b, status, *_ in shown if a == b} == {"self"}

    # storage: every tier of every worker, holding what its held chunks add up to
    held = defaultdict(int)
    for p in placements(seeded.db):
        if p.run_id in runs and p.state in HELD:
            held[p.worker, p.tier] += p.nbytes or 0
    rows = list(zip(_cells(page, "deepx-storage-tiers", "worker"),
                    _cells(page, "deepx-storage-tiers", "tier"),
                    _cells(page, "deepx-storage-tiers", "held")))
    assert sorted((w, t) for w, t, _ in rows) == sorted(tiers)
    assert {(w, t): h for w, t, h in rows} == \
        {(w, t): size_text(held.get((w, t), 0)) for w, t in tiers}  # "390.6 MiB", "0 B"
    assert sum(held.values()) > 0  # the persisted tensor is held somewhere
    assert problems == []


def test_the_persisted_tensors_chunk_grid_matches_its_placements(seeded, dashboard, browser):
    key = seeded.persisted.key
    rows = [p for p in placements(seeded.db, tensor=key, current=False) if p.state in SHOWN]
    assert rows and len(rows) == len(placements(seeded.db, tensor=key))  # all still held
    page, problems = visit(browser, dashboard, f"registry?tensor={quote(key)}", "registry-grid")
    cells = page.evaluate(GRID)
    assert sorted((c, w, s) for c, w, s, _ in cells) == \
        sorted((p.chunk, p.worker, p.state) for p in rows)
    colors = worker_colors(p.worker for p in rows)
    assert all(color == colors[w] for _, w, _, color in cells)
    chunks = len({p.chunk for p in rows})
    assert re.search(rf"\b{len(rows):,} placements? of {chunks:,} chunks?\b", page_text(page))
    assert problems == []


def test_a_section_in_the_url_opens_its_tab_and_an_unknown_one_says_so(dashboard, browser):
    page, problems = visit(browser, dashboard, "registry?section=network", "registry-section")
    page.wait_for_selector(".deepx-storage-tiers .deepx-grid-row")
    assert page.evaluate(MATRIX_DRAWN)
    assert page.locator(".deepx-operators").count() == 0
    page, more = visit(browser, dashboard, "registry?section=%3Cb%3Ebogus", "registry-bogus")
    page.wait_for_selector(".deepx-operators .deepx-grid-row")  # the first tab instead
    assert "no section '<b>bogus': the registry page has operators, network, placement" \
        in page_text(page)
    assert problems == [] and more == []


def test_an_unknown_tensor_says_so(dashboard, browser):
    page, problems = visit(browser, dashboard, "registry?tensor=nosuch%40tensor",
                           "registry-unknown")
    assert "no chunk of nosuch@tensor is held or lost on record" in page_text(page)
    assert problems == []


def test_a_tensor_key_in_the_url_shows_as_text_not_html(dashboard, browser):
    key = '<i id="injected">x</i>'
    page, problems = visit(browser, dashboard, f"registry?tensor={quote(key)}",
                           "registry-injection")
    assert f"no chunk of {key} is held or lost on record" in page_text(page)
    assert page.evaluate(FIND_INJECTED) == 0  # no element made from the key
    assert problems == []
