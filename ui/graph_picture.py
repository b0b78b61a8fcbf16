"""A compiled graph as a picture: one box per node of the graph as written, each with its
name, operator, shape and chunk grid; the nodes one fused kernel computes share a colour and
an enclosing frame named like the kernel's tasks. A box is named as the user named its node
(an input's name, a spec's node id, the name of an output it is), and by its content-hash
id, as the plan's tables name it, only when the user gave it no name.

The figure is drawn at a readable scale, the whole graph in it, inside a frame that scrolls
both ways (`figure`'s `px_per_unit`): a wide graph is reached by scrolling, not cut off at
the page's edge. A graph too big for that canvas (`MAX_CANVAS_PX`) is drawn smaller to fit,
and zoomed into with the mouse wheel.

The boxes are the graph's nodes (what `graphs.n_nodes` counts), not the fused graph's: a
fused group is then visible as the operators it holds. A node of the fused graph has a chunk
grid (the partition's); a node folded into another's kernel has none of its own, its box
says "fused". `picture` is pure (a compiled `Plan` in, plotting columns out); `figure` draws
the columns with Bokeh. Data sources are named `graph-nodes`, `graph-edges` and
`graph-groups`, so a browser test can count what is drawn.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from deepx_flow.ui.layout import edge_lines, layout

MAX_NODES = 2_000  # larger graphs draw their first nodes (closed under inputs) and say so
LAYER_STEP, SLOT_STEP = 3.0, 2.0  # data units between layers (x) and slots (y)
BOX_W, BOX_H = 2.3, 1.5
PAD = 0.3  # space between a fused group's frame and its boxes (its name goes there)
GROUP_COLORS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
                "#f7b6d2", "#dbdb8d", "#9edae5", "#c7c7c7")
PLAIN_COLOR = "#f2f2f2"
NAME_LIMIT = 70  # characters of a group's name drawn on the picture (hover has it all)
ID_LIMIT = 26  # characters of a node id drawn in its box (a box's width; hover has it all)
# Pixels per data unit: a box (BOX_W x BOX_H units) is 138 x 60 pixels, room for its text.
PX_X, PX_Y = 60.0, 40.0
MAX_CANVAS_PX = (4800, 2400)  # larger is drawn smaller (a canvas's memory is its area)
# Past this many pixels a canvas is drawn at one device pixel per pixel: at a HiDPI
# display's two, a 4800 x 2400 canvas would hold 46 million, 180 MB per layer.
HIDPI_PX = 4_000_000
# An id `make_id` gave a node the user did not name: its operator, "-", a content hash.
ANONYMOUS_ID = re.compile(r"[A-Za-z0-9_]+-[0-9a-f]{12}\Z")


def fused_members(graph, fused) -> dict[str, str]:
    """Node id of `graph` -> id of the node of `fused` (the fusion pass's result) whose tasks
    compute it. A fused node computes the nodes between it and its own inputs: walking back
    from it through the original graph, stopping at its inputs, finds them. A scalar
    constant that several kernels inline as a literal, or a cheap operator the fusion
    computes inside several kernels, goes with the first; nodes no task
    computes (an unused constant the pass dropped) are left out."""
    nodes = {n.id: n for n in graph.nodes}
    owner: dict[str, str] = {}
    for kernel in fused.nodes:
        stop = set(kernel.inputs)
        todo = [kernel.id]
        while todo:
            node_id = todo.pop()
            if node_id in owner or node_id not in nodes:
                continue
            owner[node_id] = kernel.id
            todo += [i for i in nodes[node_id].inputs if i not in stop]
    return owner


def grid_text(chunks) -> str:
    """`((64, 64), (32,))` -> "2x1 chunks"; a 0-d tensor is "1 chunk"."""
    counts = [len(c) for c in chunks]
    total = math.prod(counts)
    if not counts:
        return "1 chunk"
    return "x".join(map(str, counts)) + (" chunk" if total == 1 else " chunks")


def shape_text(shape) -> str:
    return "scalar" if shape is not None and len(shape) == 0 else \
        "x".join(map(str, shape or ())) or "?"


@dataclass(frozen=True)
class Picture:
    """Plotting columns of the nodes, the edges, the fused groups (one row each, with
    where its name goes) and their frames, and how many nodes are drawn of how many."""

    nodes: dict
    edges: dict
    groups: dict
    frames: dict
    shown: int
    total: int


def picture(plan, label=lambda node: node.op, limit: int = MAX_NODES,
            names: dict[str, str | None] | None = None) -> Picture:
    """The columns of `plan` (a compiled `Plan`): its graph's first `limit` nodes, laid out
    left to right; `label(fused node)` names a fused group (e.g. the recorder's operator
    label, as the run's task rows show it). `names` maps an output's name to the name the
    user knows it by (None: a name made up for it, not shown; by default every output name
    is the user's; `run_outputs.user_names`). Nodes come in the graph's order, which puts
    operands before their users, so the first `limit` include every input they read."""
    graph, fused, chunks = plan.graph, plan.fused, plan.partition.chunks
    drawn = list(graph.nodes[:limit])
    ids = [n.id for n in drawn]
    known = set(ids)
    edges = sorted({(src, n.id) for n in drawn for src in n.inputs if src in known})
    place = places(ids, edges)
    owner = fused_members(graph, fused)
    members: dict[str, list[str]] = {}
    for node_id in ids:
        if node_id in owner:
            members.setdefault(owner[node_id], []).append(node_id)
    kernels = {n.id: n for n in fused.nodes}
    # A group worth a frame: a kernel computing more than one drawn node.
    grouped = [k for k in members if len(members[k]) > 1]
    color = {k: GROUP_COLORS[i % len(GROUP_COLORS)] for i, k in enumerate(grouped)}
    group_names = {k: label(kernels[k]) for k in grouped}
    outputs, given = {}, {}
    for out, node_id in graph.outputs:
        outputs.setdefault(node_id, []).append(out)
        shown = out if names is None else names.get(out, out)
        if shown is not None:
            given.setdefault(node_id, []).append(shown)

    nodes = {c: [] for c in ("id", "name", "op", "shape", "dtype", "chunks", "group",
                             "outputs", "x", "y", "color", "text")}
    for n in drawn:
        x, y = place[n.id][0] * LAYER_STEP, -place[n.id][1] * SLOT_STEP
        kernel = owner.get(n.id)
        grid = grid_text(chunks[n.id]) if n.id in chunks else \
            "fused" if kernel is not None else "not computed"
        name = box_name(n.id, given.get(n.id, []))
        nodes["id"].append(n.id)
        nodes["name"].append(name)
        nodes["op"].append(n.op)
        nodes["shape"].append(shape_text(n.shape))
        nodes["dtype"].append(n.dtype or "")
        nodes["chunks"].append(grid)
        nodes["group"].append(group_names.get(kernel, ""))
        nodes["outputs"].append(", ".join(outputs.get(n.id, [])))
        nodes["x"].append(x)
        nodes["y"].append(y)
        nodes["color"].append(color.get(kernel, PLAIN_COLOR))
        nodes["text"].append(f"{id_text(name)}\n{n.op}\n{shape_text(n.shape)}\n{grid}")

    at = {node_id: (x, y) for node_id, x, y in zip(nodes["id"], nodes["x"], nodes["y"])}
    lines = edge_lines(edges, at, BOX_W)

    groups = {c: [] for c in ("name", "label", "color", "members", "x", "y")}
    frames = {c: [] for c in ("left", "right", "bottom", "top", "color", "name")}
    cells = {place[i]: owner.get(i, i) for i in ids}  # (layer, slot) -> what computes it
    for k in grouped:
        boxes = []
        for layer0, layer1, slot0, slot1 in _frames(k, [place[m] for m in members[k]], cells):
            boxes.append((layer0 * LAYER_STEP - BOX_W / 2 - PAD,
                          layer1 * LAYER_STEP + BOX_W / 2 + PAD,
                          -slot1 * SLOT_STEP - BOX_H / 2 - PAD,
                          -slot0 * SLOT_STEP + BOX_H / 2 + PAD))
        for left, right, bottom, top in boxes:
            frames["left"].append(left)
            frames["right"].append(right)
            frames["bottom"].append(bottom)
            frames["top"].append(top)
            frames["color"].append(color[k])
            frames["name"].append(group_names[k])
        # The name sits on the top-left frame.
        left, _, _, top = min(boxes, key=lambda b: (-b[3], b[0]))
        groups["name"].append(group_names[k])
        groups["label"].append(_short(group_names[k]))
        groups["color"].append(color[k])
        groups["members"].append(len(members[k]))
        groups["x"].append(left)
        groups["y"].append(top)
    return Picture(nodes, lines, groups, frames, len(drawn), len(graph.nodes))


def places(ids, edges) -> dict:
    """Node -> (layer, slot): `layout`'s, with each source (an input, a constant, a random
    tensor) moved right next to its first user, so a constant is not drawn far left of the
    one operation reading it. Within a layer, nodes keep their order and a moved source
    goes by its user's slot."""
    placed = {p.node: p for p in layout(ids, edges)}
    users: dict = {}
    for source, target in edges:
        users.setdefault(source, []).append(target)
    fed = {target for _, target in edges}
    layer, key = {}, {}
    for i, n in enumerate(ids):
        layer[n], key[n] = placed[n].layer, (placed[n].slot, 0, i)
        if n not in fed and n in users:
            first = min(placed[u].layer for u in users[n])
            if first - 1 > layer[n]:
                layer[n] = first - 1
                key[n] = (min(placed[u].slot for u in users[n] if placed[u].layer == first),
                          1, i)
    by_layer: dict = {}
    for n in ids:
        by_layer.setdefault(layer[n], []).append(n)
    return {n: (depth, slot) for depth, members in by_layer.items()
            for slot, n in enumerate(sorted(members, key=key.get))}


def _frames(kernel, cells: list, taken: dict) -> list[tuple]:
    """Frames (first layer, last layer, first slot, last slot) around a kernel's boxes at
    `cells` ((layer, slot) each; `taken` says what computes the box at each place): one
    around them all when it holds no other box, else one per run of its boxes side by side
    in a slot with no other box between, so a frame never seems to hold a node the kernel
    does not compute."""
    layers, slots = [c[0] for c in cells], [c[1] for c in cells]
    whole = (min(layers), max(layers), min(slots), max(slots))
    inside = ((layer, slot) for layer in range(whole[0], whole[1] + 1)
              for slot in range(whole[2], whole[3] + 1))
    if all(taken.get(c, kernel) == kernel for c in inside):
        return [whole]
    rows: dict = {}
    for layer, slot in cells:
        rows.setdefault(slot, []).append(layer)
    out = []
    for slot, run_layers in sorted(rows.items()):
        run_layers.sort()
        start = run_layers[0]
        for before, after in zip(run_layers, run_layers[1:]):
            if any(taken.get((layer, slot), kernel) != kernel
                   for layer in range(before + 1, after)):
                out.append((start, before, slot, slot))
                start = after
        out.append((start, run_layers[-1], slot, slot))
    return out


def box_name(node_id: str, outputs: list[str]) -> str:
    """What a node's box is called: the names the user gave it as outputs when its id is
    anonymous (a content hash: `dx.run({"loss": ...})`, a training's loss), else its id,
    which the user chose (an input's name, a spec's node id) or which is all it has."""
    return ", ".join(outputs) if outputs and ANONYMOUS_ID.match(node_id) else node_id


def id_text(node_id: str, limit: int = ID_LIMIT) -> str:
    """A node id as its box shows it: whole when it fits, else its start and its end (the
    content hash that tells nodes of one operator apart) around an ellipsis."""
    if len(node_id) <= limit:
        return node_id
    tail = (limit - 1) // 2
    return node_id[:limit - 1 - tail] + "\u2026" + node_id[-tail:]


def _short(text: str, limit: int = NAME_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def extent(pic: Picture) -> tuple[float, float, float, float]:
    """(left, right, bottom, top) in data units: every box and frame, and room for the
    frames' names above them."""
    xs, ys = pic.nodes["x"] or [0.0], pic.nodes["y"] or [0.0]
    left = min([min(xs) - BOX_W / 2 - 2 * PAD, *pic.frames["left"]])
    right = max([max(xs) + BOX_W / 2 + 2 * PAD, *pic.frames["right"]])
    bottom = min([min(ys) - BOX_H / 2 - 2 * PAD, *pic.frames["bottom"]])
    top = max([max(ys) + BOX_H / 2 + 3 * PAD, *(t + 2 * PAD for t in pic.frames["top"])])
    return left, right, bottom, top


def canvas_size(pic: Picture, px_per_unit: tuple[float, float] = (PX_X, PX_Y),
                limit: tuple[int, int] = MAX_CANVAS_PX) -> tuple[int, int]:
    """The figure's (width, height) in pixels: the whole graph at `px_per_unit`, scaled
    down (both ways alike) to fit `limit`."""
    left, right, bottom, top = extent(pic)
    width, height = (right - left) * px_per_unit[0], (top - bottom) * px_per_unit[1]
    shrink = min(1.0, limit[0] / width, limit[1] / height)
    return max(240, math.ceil(width * shrink)), max(160, math.ceil(height * shrink))


def figure(pic: Picture, title: str = "compiled graph"):
    """The Bokeh figure: group frames behind, edges, boxes with their text; hover on a box
    names its node, kernel and chunk grid. The whole graph, at `canvas_size`: put it in a
    frame that scrolls (the graph page does) to reach what the window does not show."""
    from bokeh.models import ColumnDataSource, HoverTool, Range1d
    from bokeh.plotting import figure as bokeh_figure

    nodes = ColumnDataSource(pic.nodes, name="graph-nodes")
    edges = ColumnDataSource(pic.edges, name="graph-edges")
    groups = ColumnDataSource(pic.groups, name="graph-groups")
    frames = ColumnDataSource(pic.frames, name="graph-frames")
    left, right, bottom, top = extent(pic)
    width, height = canvas_size(pic)
    fig = bokeh_figure(x_range=Range1d(left, right), y_range=Range1d(bottom, top),
                       width=width, height=height, sizing_mode="fixed", title=title,
                       hidpi=width * height <= HIDPI_PX,
                       name="graph", tools="pan,wheel_zoom,box_zoom,reset",
                       x_axis_location=None, y_axis_location=None, min_border=0,
                       toolbar_location="left")
    fig.quad(left="left", right="right", bottom="bottom", top="top", source=frames,
             fill_color="color", fill_alpha=0.35, line_color="color", line_width=2,
             name="graph-frame-quads")
    fig.text(x="x", y="y", text="label", source=groups, text_font_size="10px",
             text_baseline="top", x_offset=4, y_offset=1, text_color="#333333")
    fig.multi_line(xs="xs", ys="ys", source=edges, line_color="#777777", line_width=1.2,
                   name="graph-edge-lines")
    boxes = fig.rect(x="x", y="y", width=BOX_W, height=BOX_H, source=nodes,
                     fill_color="color", line_color="#555555", name="graph-boxes")
    fig.text(x="x", y="y", text="text", source=nodes, text_font_size="10px",
             text_align="center", text_baseline="middle", text_color="#222222")
    fig.add_tools(HoverTool(renderers=[boxes], tooltips=[
        ("node", "@id"), ("operator", "@op"), ("shape", "@shape @dtype"),
        ("chunks", "@chunks"), ("kernel", "@group"), ("output", "@outputs")]))
    fig.grid.visible = False
    return fig
