"""Where the chunks of one tensor are: its chunk grid drawn cell by cell, coloured by the
worker that holds each chunk.

`cells` is pure (placement rows in, plotting columns out). A chunk's index "i,j" is its
cell: row i, column j. A 1-D tensor is one row; a tensor of more than two dimensions keeps
its first index as the row and flattens the others, in C order, into the column (the grid
it knows is the one the rows show: each axis as long as its highest index seen). A chunk
held by several workers (replicas, or lost on one and computed again on another) splits
its cell side by side, one part per row. `figure` draws the cells with Bokeh; its data
source is named `chunk-grid`, so a browser test can compare the cells with the database.
"""

from __future__ import annotations

from collections import defaultdict

from deepx_flow.registry.cluster import format_bytes

COLUMNS = ("chunk", "row", "col", "x", "y", "width", "worker", "state", "tier", "size",
           "device", "color", "alpha", "outline")
NUMBERS = ("row", "col", "x", "y", "width", "alpha", "outline")
LEGEND_WORKERS = 16  # a longer legend would be taller than the grid
# How the state shows besides the hover: the further a chunk is from memory, the paler; a
# lost one is outlined in red. Other cells have no outline at all (width 0): a browser
# draws thousands of outlined cells twice as slowly, and hatch patterns several times.
ALPHAS = {"memory": 1.0, "spilled": 0.6, "stored": 0.35, "lost": 0.12}
OTHER_ALPHA = 0.35
LOST_OUTLINE, LOST_OUTLINE_WIDTH = "#d62728", 1.5


def chunk_index(chunk: str) -> tuple[int, ...]:
    """ "0,3" -> (0, 3); a scalar's chunk ("") -> (). ValueError for anything else."""
    return tuple(int(i) for i in chunk.split(",") if i.strip())


def well_formed(chunk: str) -> bool:
    """Whether a chunk index can be drawn: whole numbers from 0, separated by commas."""
    try:
        return all(i >= 0 for i in chunk_index(chunk))
    except ValueError:
        return False


def drawable(rows) -> tuple[list, list]:
    """The placement rows split into those with a well-formed chunk index and the others (a
    row written by another tool or by hand): a page draws the first and names the second."""
    good, bad = [], []
    for r in rows:
        (good if well_formed(r.chunk) else bad).append(r)
    return good, bad


def grid_position(index: tuple[int, ...], extents: tuple[int, ...]) -> tuple[int, int]:
    """(row, column) of a chunk index in a grid whose axes have `extents` chunks: 1-D and
    scalars on row 0; past two dimensions the trailing indices flattened in C order."""
    if len(index) <= 1:
        return 0, index[0] if index else 0
    col = 0
    for i, n in zip(index[1:], extents[1:]):
        col = col * n + i
    return index[0], col


def worker_colors(workers) -> dict[str, str]:
    """A colour per worker (in address order); palettes repeat past 256 workers."""
    from bokeh import palettes
    names = sorted(set(workers))
    n = len(names)
    palette = palettes.Category10[10] if n <= 10 else palettes.Category20[20] if n <= 20 \
        else palettes.turbo(min(n, 256))
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def cells(rows) -> dict:
    """Plotting columns, one entry per placement row (chunk, worker, state, tier, nbytes,
    device; its chunk index well formed: see `drawable`): the chunk's grid row and column,
    the x centre and width of its part of the cell, y, the worker's colour, and the state's
    fill alpha and outline width (0: none). Rows of one chunk are ordered by worker."""
    by_chunk = defaultdict(list)
    for r in rows:
        by_chunk[chunk_index(r.chunk)].append(r)
    ndim = max((len(i) for i in by_chunk), default=0)
    extents = tuple(max((i[axis] for i in by_chunk if len(i) > axis), default=0) + 1
                    for axis in range(ndim))
    colors = worker_colors(r.worker for r in rows)
    cols = {name: [] for name in COLUMNS}
    for index in sorted(by_chunk):
        held = sorted(by_chunk[index], key=lambda r: (r.worker, r.state))
        row, col = grid_position(index, extents)
        for k, r in enumerate(held):
            cols["chunk"].append(r.chunk)
            cols["row"].append(row)
            cols["col"].append(col)
            cols["x"].append(col - 0.5 + (k + 0.5) / len(held))
            cols["y"].append(row)
            cols["width"].append(1.0 / len(held))
            cols["worker"].append(r.worker)
            cols["state"].append(r.state)
            cols["tier"].append(r.tier)
            cols["size"].append("-" if r.nbytes is None else format_bytes(r.nbytes))
            cols["device"].append(r.device or "")
            cols["color"].append(colors[r.worker])
            cols["alpha"].append(ALPHAS.get(r.state, OTHER_ALPHA))
            cols["outline"].append(LOST_OUTLINE_WIDTH if r.state == "lost" else 0.0)
    return cols


def axis_labels(columns: dict) -> tuple[str, str]:
    """What the grid's columns and rows are, by the tensor's number of dimensions."""
    ndim = max((len(chunk_index(c)) for c in columns["chunk"]), default=0)
    if ndim <= 1:
        return "chunk index", ""
    along = "chunk index along axis 1" + (f" (axes 1-{ndim - 1} flattened)" if ndim > 2 else "")
    return along, "chunk index along axis 0"


def figure(columns: dict, title: str = "chunks by worker"):
    """The Bokeh grid: a rectangle per placement coloured by worker (with a legend up to
    `LEGEND_WORKERS` workers; past that the hover names the worker), paler by
    state, row 0 at the top; hover shows chunk, worker, state, tier and bytes."""
    from bokeh.models import ColumnDataSource, HoverTool, Range1d
    from bokeh.plotting import figure as bokeh_figure

    import numpy as np

    # Columns as arrays: Bokeh checks and sends them whole, not value by value.
    source = ColumnDataSource({k: np.asarray(v, dtype=float if k in NUMBERS else str)
                               for k, v in columns.items()}, name="chunk-grid")
    rows = max(columns["row"], default=0) + 1
    cols = max(columns["col"], default=0) + 1
    along, down = axis_labels(columns)
    legend = len(set(columns["worker"])) <= LEGEND_WORKERS
    # Cells about 48 x 32 pixels, shrinking past 1000 x 600 so a big grid fits the page.
    width, height = min(1000, max(300, 48 * cols)), min(600, max(64, 32 * rows))
    # Lost cells outlined only where cells are big enough to show fill inside them.
    outlined = width / cols >= 6 and height / rows >= 6
    fig = bokeh_figure(title=title, frame_width=width, frame_height=height,
                       x_range=Range1d(-0.5, cols - 0.5),
                       y_range=Range1d(rows - 0.5, -0.5), tools="pan,wheel_zoom,reset",
                       x_axis_label=along, y_axis_label=down, name="chunk-grid-figure")
    fig.rect(x="x", y="y", width="width", height=0.92, source=source, fill_color="color",
             fill_alpha="alpha", line_color=LOST_OUTLINE,
             line_width="outline" if outlined else 0,
             **({"legend_field": "worker"} if legend else {}))
    fig.add_tools(HoverTool(tooltips=[("chunk", "@chunk"), ("worker", "@worker"),
                                      ("state", "@state"), ("tier", "@tier"),
                                      ("device", "@device"), ("size", "@size")]))
    if legend:
        fig.add_layout(fig.legend[0], "right")
    for axis in (fig.xaxis, fig.yaxis):
        axis.ticker.min_interval = 1  # chunk indices are whole numbers
    fig.grid.grid_line_color = None
    return fig
