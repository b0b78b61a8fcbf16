"""Asset lineage from the materializations alone: which asset read which, and whether each
is fresh, as a layered picture.

Staleness is the rule of `deepx_flow.assets.status`, applied to database rows (the dashboard
has no asset definitions): a target (an asset, or one partition of it) is stale when its
newest version failed a blocking check, or when a target its newest usable version read has
a newer usable version than the one it read. What only the definitions know is left out:
code versions, partitions defined but never made, upstreams added since. An asset is drawn
in one of four states:

- "failed checks": its newest version (of some partition) failed a check;
- "stale": as above, for the asset or any of its partitions;
- "never materialized": other assets read it, but it has no version (a source, or its rows
  are gone);
- "fresh": otherwise.

`asset_states` and `picture` are pure; `figure` draws with Bokeh, its node source named
`lineage-nodes`, its edges an arrow from each upstream asset to each reader (`lineage-edges`,
drawn by the `lineage-arrows` annotation).
"""

from __future__ import annotations

from dataclasses import dataclass

from deepx_flow.ui.layout import edge_lines, layout

FRESH, STALE, FAILED, NEVER = "fresh", "stale", "failed checks", "never materialized"
STATE_COLORS = {FRESH: "#8fd18f", STALE: "#ffb347", FAILED: "#ef6b6b", NEVER: "#d0d0d0"}
LAYER_STEP, SLOT_STEP, BOX_W, BOX_H = 3.0, 1.6, 2.4, 1.15
ARROW_PX = 9  # an arrowhead's size, in pixels
MAX_VISIBLE_LAYERS, MAX_VISIBLE_SLOTS = 7, 10
MAX_ASSETS = 2_000  # boxes drawn; more are left out, and the picture says so


@dataclass(frozen=True)
class Version:
    """One stored version of a target, as the lineage needs it."""

    asset: str
    partition: str | None
    version: str
    upstream: dict  # "asset" or "asset[partition]" -> the version it read
    created_at: float
    checks_passed: bool | None = None
    blocked: bool = False  # a blocking check failed: nothing downstream uses this version


@dataclass(frozen=True)
class AssetState:
    asset: str
    state: str
    stale: bool  # what dx.status says, as far as the rows tell
    reasons: tuple[str, ...]
    upstream: tuple[str, ...]  # assets its newest versions read
    partitions: int | None  # partitions with a usable version (None: not partitioned)
    version: str | None  # newest usable version (unpartitioned assets)
    materialized_at: float | None


def target_key(asset: str, partition: str | None) -> str:
    """How a version names what it read: "asset" or "asset[partition]" (assets.Target)."""
    return asset if partition is None else f"{asset}[{partition}]"


def key_asset(key: str) -> str:
    """The asset of a target key; asset names are identifiers, so "[" starts a partition."""
    return key.split("[", 1)[0]


def asset_states(newest, usable) -> dict[str, AssetState]:
    """Per asset (assets with versions, then assets only read, by name): its state.

    `newest`: the newest `Version` of every target; `usable`: the newest version of each
    target whose blocking checks passed (targets without one left out)."""
    usable_at = {target_key(v.asset, v.partition): v for v in usable}
    targets: dict[str, list] = {}
    for v in newest:
        targets.setdefault(v.asset, []).append(v)
    states: dict[str, AssetState] = {}
    read: set[str] = set()
    for asset in sorted(targets):
        reasons: list[str] = []
        failed = False
        used_rows = []
        for top in sorted(targets[asset], key=lambda v: v.partition or ""):
            key = target_key(asset, top.partition)
            row = usable_at.get(key)
            where = f"[{top.partition}] " if top.partition is not None else ""
            failed = failed or top.checks_passed is False
            if top.blocked:
                reasons.append(f"{where}version {top.version[:12]} failed a blocking check")
            if row is None:
                continue
            used_rows.append(row)
            for up_key, used in sorted(row.upstream.items()):
                current = usable_at.get(up_key)
                if current is not None and current.version != used:
                    reasons.append(f"{where}upstream {up_key} has a newer version")
        # Edges: what the newest versions read, failed ones included.
        ups = {key_asset(k) for v in targets[asset] + used_rows for k in v.upstream} - {asset}
        read |= ups
        stale = bool(reasons)
        partitioned = any(v.partition is not None for v in targets[asset])
        states[asset] = AssetState(
            asset, FAILED if failed else STALE if stale else FRESH, stale, tuple(reasons),
            tuple(sorted(ups)),
            sum(1 for r in used_rows if r.partition is not None) if partitioned else None,
            None if partitioned or not used_rows else used_rows[0].version,
            max((r.created_at for r in used_rows), default=None))
    for asset in sorted(read - set(states)):
        states[asset] = AssetState(asset, NEVER, True, ("never materialized",), (), None, None,
                                   None)
    return states


def picture(states: dict[str, AssetState], when=lambda t: str(t),
            limit: int = MAX_ASSETS) -> tuple[dict, dict, str]:
    """Node and edge columns of the first `limit` assets, laid out left to right, and a
    note ("", or what was left out, or that a cycle, which real lineages cannot have, left
    the boxes unlayered). `when` formats a materialization time."""
    names = list(states)[:limit]
    notes = [f"the first {limit:,} of {len(states):,} assets"] if len(states) > limit else []
    states = {name: states[name] for name in names}
    edges = sorted({(u, a) for a, s in states.items() for u in s.upstream if u in states})
    try:
        placed = layout(names, edges)
    except ValueError as err:
        placed = layout(names, [])
        notes.append(f"lineage not layered ({err}); edges drawn as found")
    at = {p.node: (p.layer * LAYER_STEP, -p.slot * SLOT_STEP) for p in placed}
    nodes = {c: [] for c in ("asset", "state", "color", "x", "y", "text", "detail",
                             "reasons")}
    for name, s in states.items():
        if s.partitions is not None:
            detail = f"{s.partitions} partition{'' if s.partitions == 1 else 's'}"
        else:
            detail = (s.version or "-")[:12]
        nodes["asset"].append(name)
        nodes["state"].append(s.state)
        nodes["color"].append(STATE_COLORS[s.state])
        nodes["x"].append(at[name][0])
        nodes["y"].append(at[name][1])
        nodes["text"].append(f"{name}\n{s.state}\n{detail}")
        nodes["detail"].append(detail if s.materialized_at is None
                               else f"{detail}, {when(s.materialized_at)}")
        nodes["reasons"].append("; ".join(s.reasons) or "-")
    lines = edge_lines(edges, at, BOX_W)
    return nodes, lines, "; ".join(notes)


def arrows(edges: dict) -> dict:
    """`edge_lines`' columns as arrows: where each starts (the upstream box's right side)
    and ends (the reader's left side), with its source and target."""
    return {"x_start": [xs[0] for xs in edges["xs"]], "y_start": [ys[0] for ys in edges["ys"]],
            "x_end": [xs[-1] for xs in edges["xs"]], "y_end": [ys[-1] for ys in edges["ys"]],
            "source": list(edges["source"]), "target": list(edges["target"])}


def figure(nodes: dict, edges: dict, title: str = "asset lineage"):
    """The Bokeh figure: an arrow from each upstream asset to its readers, boxes coloured by
    state; hover shows the state, version or partitions, time and reasons."""
    from bokeh.models import Arrow, ColumnDataSource, HoverTool, Range1d, VeeHead
    from bokeh.plotting import figure as bokeh_figure

    source = ColumnDataSource(nodes, name="lineage-nodes")
    lines = ColumnDataSource(arrows(edges), name="lineage-edges")
    xs, ys = nodes["x"] or [0.0], nodes["y"] or [0.0]
    # Open on the first layers and rows (as wide as MAX_VISIBLE_LAYERS layers even when
    # there are fewer, so boxes keep one size); pan and zoom reach the rest.
    right = min(xs) + (MAX_VISIBLE_LAYERS - 1) * LAYER_STEP
    bottom = max(min(ys), max(ys) - (MAX_VISIBLE_SLOTS - 1) * SLOT_STEP)
    rows = round((max(ys) - bottom) / SLOT_STEP) + 1
    fig = bokeh_figure(height=max(220, 80 + 80 * rows), sizing_mode="stretch_width",
                       title=title, name="lineage", tools="pan,wheel_zoom,box_zoom,reset",
                       x_axis_location=None, y_axis_location=None, min_border_left=12,
                       x_range=Range1d(min(xs) - BOX_W, right + BOX_W),
                       y_range=Range1d(bottom - BOX_H, max(ys) + BOX_H))
    fig.add_layout(Arrow(x_start="x_start", y_start="y_start", x_end="x_end", y_end="y_end",
                         source=lines, line_color="#777777", line_width=1.5,
                         end=VeeHead(size=ARROW_PX, line_color="#555555", line_width=1.5),
                         name="lineage-arrows"))
    boxes = fig.rect(x="x", y="y", width=BOX_W, height=BOX_H, source=source,
                     fill_color="color", line_color="#555555", name="lineage-boxes")
    fig.text(x="x", y="y", text="text", source=source, text_font_size="11px",
             text_align="center", text_baseline="middle", text_color="#222222")
    fig.add_tools(HoverTool(renderers=[boxes], tooltips=[
        ("asset", "@asset"), ("state", "@state"), ("version", "@detail"),
        ("why", "@reasons")]))
    fig.grid.visible = False
    return fig

