"""A training's loss per step, and its held-out loss, as a Bokeh chart on the run page.

`curves` is pure (metric rows in, plotting columns out); `figure` draws them. The data
sources are named `loss-source` and `eval-loss-source`, so a browser test can count the
points. Steps are x, the loss y (a log axis: losses fall by orders of magnitude).
"""

from __future__ import annotations


def curves(metrics: dict[str, list[tuple[int, float]]]) -> tuple[dict, dict]:
    """(training loss columns, held-out loss columns): step and loss arrays, in step
    order, without values that are not finite or positive (a log axis cannot show them)."""
    import numpy as np

    def columns(name):
        rows = [(s, v) for s, v in metrics.get(name, ()) if np.isfinite(v) and v > 0]
        return {"step": np.array([s for s, _ in rows], dtype="int64"),
                "loss": np.array([v for _, v in rows], dtype="float64")}
    return columns("loss"), columns("eval_loss")


def figure(train: dict, held_out: dict):
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure as bokeh_figure

    fig = bokeh_figure(sizing_mode="stretch_width", height=260, y_axis_type="log",
                       title="loss per step", name="loss-curve", x_axis_label="step",
                       tools="xpan,xwheel_zoom,reset")
    source = ColumnDataSource(train, name="loss-source")
    held = ColumnDataSource(held_out, name="eval-loss-source")
    fig.line("step", "loss", source=source, color="#4c78a8", legend_label="training loss")
    fig.line("step", "loss", source=held, color="#f58518", legend_label="held-out loss")
    fig.scatter("step", "loss", source=held, color="#f58518", size=6)
    fig.add_tools(HoverTool(tooltips=[("step", "@step"), ("loss", "@loss{0.0000}")]))
    fig.legend.location = "top_right"
    return fig


def show(fig, train: dict, held_out: dict) -> None:
    """New points for a figure made by `figure` (a live page updates it in place)."""
    fig.select_one({"name": "loss-source"}).data = train
    fig.select_one({"name": "eval-loss-source"}).data = held_out
