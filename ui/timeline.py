"""A run's tasks as a Gantt chart: one bar per task attempt, one lane per worker.

`bars` is pure (task rows in, plotting columns out); `figure` draws them with Bokeh. The
data source is named `timeline-source`, so a browser test can count the bars.
"""

from __future__ import annotations

LABELS = {"memory": "finished"}  # the legend's word for a status
# Colours by shown status; any other status is grey.
STATUS_COLORS = {"finished": "#4c78a8", "erred": "#e45756", "retried": "#f58518",
                 "drifted": "#b279a2"}
OTHER_COLOR = "#9d9d9d"
NO_WORKER = "(no worker)"


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


def figure(columns: dict, title: str = "tasks per worker"):
    """The Bokeh figure: bars coloured by status, hover showing operator, key and error."""
    from bokeh.models import CategoricalColorMapper, ColumnDataSource, HoverTool
    from bokeh.plotting import figure as bokeh_figure

    source = ColumnDataSource(columns, name="timeline-source")
    fig = bokeh_figure(y_range=[NO_WORKER], sizing_mode="stretch_width", title=title,
                       name="timeline", x_axis_label="seconds since the run started",
                       tools="xpan,xwheel_zoom,reset")
    colors = CategoricalColorMapper(factors=list(STATUS_COLORS),
                                    palette=list(STATUS_COLORS.values()), nan_color=OTHER_COLOR)
    fig.hbar(y="worker", left="left", right="right", height=0.7, source=source,
             color={"field": "status", "transform": colors}, name="timeline-bars",
             legend_field="status")
    fig.add_layout(fig.legend[0], "right")  # not over the bars
    fig.add_tools(HoverTool(tooltips=[("operator", "@operator"), ("key", "@key"),
                                      ("status", "@status"), ("attempt", "@attempts"),
                                      ("error", "@error")]))
    fig.ygrid.grid_line_color = None
    show(fig, columns, title)
    return fig


def show(fig, columns: dict, title: str) -> None:
    """Put new bars into a figure made by `figure` (a live page updates it in place)."""
    rows = lanes(columns) or [NO_WORKER]
    fig.y_range.factors = list(reversed(rows))
    fig.height = max(180, 70 + 36 * len(rows))
    fig.title.text = title
    fig.select_one({"name": "timeline-source"}).data = columns
