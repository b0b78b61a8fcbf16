"""The run page's Gantt chart: one bar per task attempt that ran, on its worker's lane,
placed in seconds from the run's start, coloured by how it ended."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.meta.models import Task
from deepx_flow.ui.timeline import (NO_WORKER, OTHER_COLOR, STATUS_COLORS, bars, figure,
                                    lanes)

START = 1.8e9


@st.composite
def task_rows(draw):
    n = draw(st.integers(0, 30))
    rows = []
    for i in range(n):
        start = draw(st.one_of(st.none(), st.floats(0, 100)))
        took = draw(st.floats(0, 10))
        rows.append(Task(run_id="r", key=f"('n@t', {i})", tensor="n@t", operator="relu",
                         worker=draw(st.sampled_from([None, "tcp://a:1", "tcp://b:2"])),
                         start=None if start is None else START + start,
                         stop=None if start is None else START + start + took,
                         status=draw(st.sampled_from(["memory", "erred", "retried",
                                                      "drifted", "odd"])),
                         error=draw(st.sampled_from([None, "ValueError: bad\nmore lines"]))))
    return rows


@settings(max_examples=100, deadline=None)
@given(task_rows())
def test_each_task_that_ran_is_one_bar_on_its_workers_lane(rows):
    cols = bars(rows, START)
    ran = [t for t in rows if t.start is not None]
    assert len(cols["left"]) == len(ran) and all(len(v) == len(ran) for v in cols.values())
    for t, worker, left, right, status, error in zip(ran, cols["worker"], cols["left"],
                                                     cols["right"], cols["status"],
                                                     cols["error"]):
        assert worker == (t.worker or NO_WORKER)
        assert left == t.start - START and right == t.stop - START and left <= right
        assert status == ("finished" if t.status == "memory" else t.status)
        assert "\n" not in error
    assert lanes(cols) == sorted({t.worker or NO_WORKER for t in ran})


def test_the_bars_are_coloured_by_status_and_other_statuses_are_grey():
    fig = figure(bars([], START))
    [bars_glyph] = fig.select({"name": "timeline-bars"})
    mapper = bars_glyph.glyph.fill_color.transform
    assert dict(zip(mapper.factors, mapper.palette)) == STATUS_COLORS
    assert mapper.nan_color == OTHER_COLOR and set(STATUS_COLORS) >= {"finished", "erred"}


def test_the_figure_names_its_source_for_the_browser_tests():
    rows = [Task(run_id="r", key="k", tensor="n@t", operator="relu", worker="tcp://a:1",
                 start=START, stop=START + 1.0)]
    fig = figure(bars(rows, START))
    source = fig.select_one({"name": "timeline-source"})
    assert list(source.data["left"]) == [0.0] and list(source.data["key"]) == ["k"]


@settings(max_examples=50, deadline=None)
@given(task_rows())
def test_each_bar_is_drawn_on_the_lane_its_worker_is_named_on(rows):
    """The browser gets lane numbers, not worker names; the axis names each lane, the first
    worker (by address) on top."""
    cols = bars(rows, START)
    fig = figure(cols)
    data = fig.select_one({"name": "timeline-source"}).data
    names = fig.yaxis[0].major_label_overrides
    assert list(fig.yaxis[0].ticker.ticks) == list(range(len(names)))
    assert [names[lane] for lane in data["lane"]] == cols["worker"]
    assert [names[i] for i in sorted(names)] == (lanes(cols) or [NO_WORKER])
    assert fig.y_range.start > fig.y_range.end  # lane 0 at the top
    assert list(data["status"]) == cols["status"] and list(data["key"]) == cols["key"]
    operators = fig.select_one({"name": "timeline-operators"}).args["names"]
    assert [operators[i] for i in data["operator"]] == cols["operator"]
