"""The registry page's link matrix: every ordered pair of the workers that the links name
gets one cell; a measured pair carries its row's bandwidth and latency, a pair never measured
says so, and a worker with itself is no link."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.meta.models import Link
from deepx_flow.ui.link_matrix import MEASURED, MISSING, SELF, cells, figure, scale, workers

ADDRESSES = [f"tcp://10.0.0.{i}:4000" for i in range(6)]


@st.composite
def link_rows(draw):
    names = draw(st.lists(st.sampled_from(ADDRESSES), min_size=0, max_size=6, unique=True))
    pairs = [(a, b) for a in names for b in names if a != b]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True) if pairs else st.just([]))
    return [Link(scheduler="s", source=a, target=b, protocol="tcp",
                 bandwidth=draw(st.floats(1e3, 1e11)), latency=draw(st.floats(1e-6, 1e-1)),
                 measured_at=0.0) for a, b in chosen]


@settings(max_examples=200, deadline=None)
@given(link_rows())
def test_every_pair_is_one_cell_and_measured_cells_are_the_rows(rows):
    cols = cells(rows)
    names = workers(rows)
    n = len(names)
    assert all(len(v) == n * n for v in cols.values())
    assert list(zip(cols["source"], cols["target"])) == [(a, b) for a in names for b in names]
    by_pair = {(r.source, r.target): r for r in rows}
    for i, (a, b, status) in enumerate(zip(cols["source"], cols["target"], cols["status"])):
        row = by_pair.get((a, b))
        if row is not None:
            assert status == MEASURED
            assert cols["bandwidth"][i] == row.bandwidth
            assert math.isclose(cols["gbps"][i], row.bandwidth / 1e9)
            assert math.isclose(cols["latency_ms"][i], row.latency * 1e3)
            assert cols["protocol"][i] == "tcp"
            assert f"{row.bandwidth / 1e9:.2f} GB/s" in cols["label"][i]
        else:
            assert status == (SELF if a == b else MISSING)
            assert math.isnan(cols["bandwidth"][i]) and math.isnan(cols["gbps"][i])
            assert cols["label"][i] == ("" if a == b else "-")
    assert cols["status"].count(MEASURED) == len(rows)
    low, high = scale(cols)
    assert low == 0.0 and high == (max(r.bandwidth for r in rows) / 1e9 if rows else 1.0)


def test_a_pair_measured_one_way_only_shows_the_other_way_missing():
    a, b = ADDRESSES[:2]
    cols = cells([Link(scheduler="s", source=a, target=b, protocol="tcp", bandwidth=2e9,
                       latency=1e-4, measured_at=0.0)])
    status = dict(zip(zip(cols["source"], cols["target"]), cols["status"]))
    assert status == {(a, a): SELF, (a, b): MEASURED, (b, a): MISSING, (b, b): SELF}
    assert cols["label"][1] == "2.00 GB/s\n0.10 ms"


def test_the_figure_names_its_source_and_puts_sources_on_rows():
    rows = [Link(scheduler="s", source=a, target=b, protocol="tcp", bandwidth=1e9,
                 latency=1e-4, measured_at=0.0)
            for a in ADDRESSES[:3] for b in ADDRESSES[:3] if a != b]
    fig = figure(cells(rows))
    source = fig.select_one({"name": "link-matrix"})
    assert len(source.data["gbps"]) == 9
    assert list(fig.x_range.factors) == ADDRESSES[:3]
    assert list(fig.y_range.factors) == ADDRESSES[:3][::-1]  # the first source on top


def test_no_links_draws_an_empty_matrix():
    cols = cells([])
    assert all(v == [] for v in cols.values()) and scale(cols) == (0.0, 1.0)
    assert len(figure(cols).select_one({"name": "link-matrix"}).data["source"]) == 0
