"""A training's loss per step, and its held-out loss, as a Bokeh chart on the run page.

`curves` and `legend` are pure (metric rows in, plotting columns and the legend's entries
out); `figure` draws them. The data sources are named `loss-source` and
`eval-loss-source`, and the legend `loss-legend`, so a browser test can count the points and
read what is listed. Steps are x, the loss y (a log axis: losses fall by orders of
magnitude). A curve without points (a training given no held-out data) is neither drawn nor
in the legend.
"""

from __future__ import annotations

TRAIN, HELD_OUT = "training loss", "held-out loss"


def curves(metrics: dict[str, list[tuple[int, float]]]) -> tuple[dict, dict]:
    """(training loss columns, held-out loss columns): step and loss arrays, in step
    order, without values that are not finite or positive (a log axis cannot show them)."""
    import numpy as np

    def columns(name):
        rows = [(s, v) for s, v in metrics.get(name, ()) if np.isfinite(v) and v > 0]
        return {"step": np.array([s for s, _ in rows], dtype="int64"),
                "loss": np.array([v for _, v in rows], dtype="float64")}
    return columns("loss"), columns("eval_loss")


def legend(train: dict, held_out: dict) -> dict[str, bool]:
    """Each curve's legend label -> whether it has points to draw (and so is listed)."""
    return {TRAIN: len(train["step"]) > 0, HELD_OUT: len(held_out["step"]) > 0}


def figure(train: dict, held_out: dict):
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure as bokeh_figure

    fig = bokeh_figure(sizing_mode="stretch_width", height=260, y_axis_type="log",
                       title="loss per step", name="loss-curve", x_axis_label="step",
                       tools="xpan,xwheel_zoom,reset")
    source = ColumnDataSource(train, name="loss-source")
    held = ColumnDataSource(held_out, name="eval-loss-source")
    fig.line("step", "loss", source=source, color="#4c78a8", legend_label=TRAIN,
             name="loss-line")
    # The held-out loss is measured every few steps: its points are marked, so that one
    # evaluation (no line to draw yet) still shows.
    fig.line("step", "loss", source=held, color="#f58518", legend_label=HELD_OUT,
             name="eval-loss-line")
    fig.scatter("step", "loss", source=held, color="#f58518", size=6, legend_label=HELD_OUT,
                name="eval-loss-points")
    fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("loss", "@loss{0.0000}")]))
    fig.legend.location = "top_right"
    fig.legend[0].name = "loss-legend"
    show(fig, train, held_out)
    return fig


def show(fig, train: dict, held_out: dict) -> None:
    """New points for a figure made by `figure` (a live page updates it in place)."""
    fig.select_one({"name": "loss-source"}).data = train
    fig.select_one({"name": "eval-loss-source"}).data = held_out
    listed = legend(train, held_out)
    for item in fig.legend[0].items:
        item.visible = listed[item.label["value"]]
        for renderer in item.renderers:
            renderer.visible = item.visible
