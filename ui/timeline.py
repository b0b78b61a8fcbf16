"""A run's tasks as a Gantt chart: one bar per task attempt, one lane per worker.

`bars` is pure (task rows in, plotting columns out); `figure` draws them with Bokeh. The
data source is named `timeline-source`, so a browser test can count the bars.

What goes to the browser is kept small, because a big run draws 10,000 bars and the page
must render in under 2 s: the workers are lane numbers (their names are on the axis only,
not repeated per bar), the operators numbers into a list of their names (the hover looks the
name up), text columns are arrays (Bokeh does not walk them item by item), and the bars have
no outline (a second path per bar to rasterize).
"""

from __future__ import annotations

LABELS = {"memory": "finished"}  # the legend's word for a status
# Colours by shown status; any other status is grey.
STATUS_COLORS = {"finished": "#4c78a8", "erred": "#e45756", "retried": "#f58518",
                 "drifted": "#b279a2"}
OTHER_COLOR = "#9d9d9d"
NO_WORKER = "(no worker)"
TEXT = ("status", "key", "error")  # the columns sent as text
# A lane's height in pixels: roomy for a few workers, compact for many (64 workers at 36 px
# made a 2,400-pixel canvas, slow to paint).
LANE_PX, COMPACT_LANE_PX, COMPACT_PAST = 36, 20, 16


def bars(tasks, run_start: float) -> dict:
    """Plotting columns, one entry per task that has a start and a stop: its lane (worker),
    seconds from the run's start to its start and stop, status (as the legend says it),
    operator, key, attempt and the first line of its error. Tasks without times (never
    started) have no bar. Numbers are NumPy arrays, which Bokeh sends as binary."""
    import numpy as np

    ran = [t for t in tasks if t.start is not None and t.stop is not None]
    return {
        "worker": [t.worker or NO_WORKER for t in ran],
        "left": np.array([t.start - run_start for t in ran], dtype="float64"),
        "right": np.array([max(t.stop, t.start) - run_start for t in ran], dtype="float64"),
        "status": [LABELS.get(t.status, t.status) for t in ran],
        "operator": [t.operator for t in ran],
        "key": [t.key for t in ran],
        "attempts": np.array([t.attempts for t in ran], dtype="int32"),
        "error": [t.error.splitlines()[0][:200] if t.error else "" for t in ran],
    }


def lanes(columns: dict) -> list[str]:
    """The workers, in a stable order (by address), for the chart's rows."""
    return sorted(set(columns["worker"]))


def operator_names(columns: dict) -> list[str]:
    """The operators of the bars, by name: what the source's operator numbers index."""
    return sorted(set(columns["operator"]))


def source_data(columns: dict, rows: list[str], operators: list[str]) -> dict:
    """The columns as the chart's data source holds them: each bar's worker as its lane's
    number in `rows` (0 at the top), its operator as its number in `operators`
    (`operator_names`), the text columns as NumPy arrays."""
    import numpy as np

    lane = {worker: i for i, worker in enumerate(rows)}
    number = {name: i for i, name in enumerate(operators)}
    data = {k: v for k, v in columns.items() if k != "worker"}
    data["lane"] = np.array([lane[w] for w in columns["worker"]], dtype="int32")
    data["operator"] = np.array([number[o] for o in columns["operator"]], dtype="int32")
    for name in TEXT:
        data[name] = np.array(columns[name], dtype=str)
    return data


def figure(columns: dict, title: str = "tasks per worker"):
    """The Bokeh figure: bars coloured by status, hover showing operator, key and error."""
    from bokeh.models import (CategoricalColorMapper, ColumnDataSource, CustomJSHover,
                              FixedTicker, HoverTool, Range1d)
    from bokeh.plotting import figure as bokeh_figure

    source = ColumnDataSource(source_data(bars([], 0.0), [], []), name="timeline-source")
    fig = bokeh_figure(y_range=Range1d(0.5, -0.5), sizing_mode="stretch_width", title=title,
                       name="timeline", x_axis_label="seconds since the run started",
                       tools="xpan,xwheel_zoom,reset")
    colors = CategoricalColorMapper(factors=list(STATUS_COLORS),
                                    palette=list(STATUS_COLORS.values()), nan_color=OTHER_COLOR)
    fig.hbar(y="lane", left="left", right="right", height=0.7, source=source,
             fill_color={"field": "status", "transform": colors}, line_color=None,
             name="timeline-bars", legend_field="status")
    fig.add_layout(fig.legend[0], "right")  # not over the bars
    # The operator's name by its number (our own code; the names are data, shown as text).
    operator = CustomJSHover(name="timeline-operators", args={"names": []},
                             code="return names[value] ?? ''")
    fig.add_tools(HoverTool(tooltips=[("operator", "@operator{custom}"), ("key", "@key"),
                                      ("status", "@status"), ("attempt", "@attempts"),
                                      ("error", "@error")],
                            formatters={"@operator": operator}))
    fig.yaxis.ticker = FixedTicker(ticks=[])
    fig.yaxis.minor_tick_line_color = None
    fig.ygrid.grid_line_color = None
    show(fig, columns, title)
    return fig


def show(fig, columns: dict, title: str) -> None:
    """Put new bars into a figure made by `figure` (a live page updates it in place)."""
    rows = lanes(columns) or [NO_WORKER]
    fig.y_range.update(start=len(rows) - 0.5, end=-0.5)  # lane 0 at the top
    fig.yaxis.ticker.ticks = list(range(len(rows)))
    fig.yaxis.major_label_overrides = dict(enumerate(rows))
    lane_px = LANE_PX if len(rows) <= COMPACT_PAST else COMPACT_LANE_PX
    fig.height = max(180, 70 + lane_px * len(rows))
    fig.title.text = title
    operators = operator_names(columns)
    fig.select_one({"name": "timeline-operators"}).args = {"names": operators}
    fig.select_one({"name": "timeline-source"}).data = source_data(columns, rows, operators)
