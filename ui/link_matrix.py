"""The measured network links of a cluster as a matrix: one cell per ordered worker pair,
coloured by bandwidth.

`cells` is pure (link rows in, plotting columns out). Every pair of the workers named by the
rows gets a cell, so a pair that was never measured shows as such instead of leaving a hole;
a worker with itself is a "self" cell (no link). `figure` draws the cells with Bokeh (source
on the rows, target on the columns); its data source is named `link-matrix`, so a browser
test can read the bandwidths it shows.
"""

from __future__ import annotations

import math

MEASURED, MISSING, SELF = "measured", "not measured", "self"
NO_VALUE = float("nan")  # the colour mapper draws NaN in its nan_color
PALETTE = "Blues256"
EMPTY_COLOR = "#eeeeee"
COLUMNS = ("source", "target", "status", "protocol", "bandwidth", "gbps", "latency_ms",
           "label", "text_color")
NUMBERS = ("bandwidth", "gbps", "latency_ms")
LABELLED = 12  # workers up to which each cell shows its numbers


def workers(links) -> list[str]:
    """Every worker that is the source or the target of a link, by address."""
    return sorted({link.source for link in links} | {link.target for link in links})


def cells(links) -> dict:
    """Plotting columns with one entry per ordered pair (source, target) of `workers(links)`,
    sources then targets in address order: its status (measured, not measured, self), the
    protocol, bandwidth in bytes/s and GB/s, latency in ms (NaN where not measured), the text
    drawn in the cell and its colour (white on the darker half of the scale).

    `links` are rows with source, target, protocol, bandwidth (bytes/s) and latency (s), one
    per measured pair (as the `links` table holds them for one scheduler)."""
    measured = {(link.source, link.target): link for link in links}
    top = max((link.bandwidth for link in links), default=0.0)
    cols = {name: [] for name in COLUMNS}
    names = workers(links)
    for source in names:
        for target in names:
            link = measured.get((source, target))
            status = SELF if source == target else MEASURED if link else MISSING
            cols["source"].append(source)
            cols["target"].append(target)
            cols["status"].append(status)
            if link is None:
                for name in ("bandwidth", "gbps", "latency_ms"):
                    cols[name].append(NO_VALUE)
                cols["protocol"].append("")
                cols["label"].append("" if status == SELF else "-")
                cols["text_color"].append("black")
                continue
            cols["protocol"].append(link.protocol)
            cols["bandwidth"].append(float(link.bandwidth))
            cols["gbps"].append(link.bandwidth / 1e9)
            cols["latency_ms"].append(link.latency * 1e3)
            cols["label"].append(f"{link.bandwidth / 1e9:.2f} GB/s\n{link.latency * 1e3:.2f} ms")
            dark = top > 0 and link.bandwidth / top > 0.55
            cols["text_color"].append("white" if dark else "black")
    return cols


def scale(columns: dict) -> tuple[float, float]:
    """The colour scale in GB/s: from 0 to the highest measured bandwidth (1 with none)."""
    top = max((g for g in columns["gbps"] if not math.isnan(g)), default=0.0)
    return 0.0, top if top > 0 else 1.0


def figure(columns: dict, title: str = "bandwidth between workers"):
    """The Bokeh heatmap: source x target rectangles coloured by GB/s, hover with the
    protocol, bandwidth and latency; a colour bar in GB/s. Up to `LABELLED` workers the
    cells are big enough to write the bandwidth and latency in; past that they are small
    (the hover still tells)."""
    import numpy as np
    from bokeh.models import ColorBar, ColumnDataSource, HoverTool, LinearColorMapper
    from bokeh.plotting import figure as bokeh_figure

    names = sorted(set(columns["source"])) or ["(no links)"]
    labelled = len(names) <= LABELLED
    # Columns as arrays: Bokeh checks and sends them whole, not value by value. The cells'
    # text only where it is drawn (64 workers' 4,096 labels were a fifth of the document).
    unused = () if labelled else ("label", "text_color")
    source = ColumnDataSource({k: np.asarray(v, dtype=float if k in NUMBERS else str)
                               for k, v in columns.items() if k not in unused},
                              name="link-matrix")
    cell_width, cell_height = (110, 50) if labelled else (16, 16)
    low, high = scale(columns)
    # Blues256 runs dark to light; reversed, more bandwidth is darker.
    mapper = LinearColorMapper(palette=list(reversed(_palette(PALETTE))), low=low, high=high,
                               nan_color=EMPTY_COLOR)
    fig = bokeh_figure(x_range=names, y_range=list(reversed(names)), title=title,
                       frame_width=cell_width * len(names),
                       frame_height=max(100, cell_height * len(names)),
                       x_axis_label="target (receives)", y_axis_label="source (sends)",
                       tools="", toolbar_location=None, name="link-matrix-figure")
    # No outlines (a second path per cell to draw): the gaps between cells are the grid.
    fig.rect(x="target", y="source", width=0.94, height=0.94, source=source,
             fill_color={"field": "gbps", "transform": mapper}, line_color=None)
    if labelled:
        fig.text(x="target", y="source", text="label", source=source, text_align="center",
                 text_baseline="middle", text_font_size="11px", text_color="text_color")
    fig.add_tools(HoverTool(tooltips=[("source", "@source"), ("target", "@target"),
                                      ("status", "@status"), ("protocol", "@protocol"),
                                      ("bandwidth", "@gbps{0.000} GB/s"),
                                      ("latency", "@latency_ms{0.000} ms")]))
    fig.add_layout(ColorBar(color_mapper=mapper, title="GB/s", width=12), "right")
    fig.xaxis.major_label_orientation = 0.6 if labelled else 1.2
    if not labelled:
        fig.axis.major_label_text_font_size = "8px"
    fig.grid.grid_line_color = None
    return fig


def _palette(name: str) -> list[str]:
    from bokeh import palettes
    return list(getattr(palettes, name))
