"""The graph page, in two tabs (`ui/sections.py`): the run's graph as compiled
(`graph?run=...`, default the latest run), operators in boxes with their chunk grids and
fused kernels framed together, above the plan the run recorded; and the asset lineage
coloured by staleness (`graph?section=lineage`).

The compiled graph is rebuilt from the graph's recorded YAML (`ui/run_plan.py`: a safe
loader, the spec reader, the compiler), never from anything executable in the database.
"""

from __future__ import annotations

import panel as pn

from deepx_flow.errors import InputError
from deepx_flow.meta.queries import find_run, list_runs
from deepx_flow.ui import graph_picture, lineage
from deepx_flow.ui.asset_versions import MAX_TARGETS, newest_versions
from deepx_flow.ui.run_outputs import output_rows, recorded_outputs, stored_by, user_names
from deepx_flow.ui.run_plan import rebuild
from deepx_flow.ui.sections import section_tabs
from deepx_flow.ui.session import session_arg
from deepx_flow.ui.text import Text
from deepx_flow.ui.table import utc_text

PLAN_LINES = 200  # of a run's recorded plan text (a big graph's runs to thousands)
LEGEND = ("Boxes: operators of the graph as written (the name the user gave the node: an "
          "input's, a spec's node id, an output's; for a node given none, its id as the plan "
          "names it; then its operator, shape, chunk grid, \"fused\" when another node's "
          "kernel computes it). A coloured frame holds the operators one fused kernel "
          "computes, named as its tasks are. Scroll the picture to see all of it; hover over a "
          "box for its node id.")
VIEW_PX = 800  # the picture's frame is at most this tall; it scrolls to show the rest
LINEAGE_LEGEND = ("Green: fresh. Orange: stale (an upstream has a newer version than the "
                  "one read, or a blocking check failed). Red: the newest version failed a "
                  "check. Grey: read by others but never materialized.")


def graph_page(db, scheduler=None):
    sections = [("compiled", "Compiled graph", lambda: _compiled(db)),
                ("lineage", "Asset lineage", lambda: _lineage(db))]
    return pn.Column(*section_tabs(sections, session_arg("section"), "graph"),
                     sizing_mode="stretch_width")


def _compiled(db) -> list:
    wanted = session_arg("run")
    if wanted:
        try:
            run = find_run(db, wanted)
        except InputError as err:
            return [Text(str(err), css_classes=["deepx-graph-problem"])]
    else:
        latest = list_runs(db, limit=1)
        if not latest:
            return [Text("no runs recorded yet")]
        run = latest[0]
    parts = [Text(f"run {run.id} ({run.kind}, {run.status}, started "
                               f"{utc_text(run.started_at)} UTC), graph {run.graph_hash}",
                               css_classes=["deepx-graph-run"])]
    rebuilt = rebuild(db, run)
    if rebuilt.plan is None:
        parts.append(Text(rebuilt.problem, css_classes=["deepx-graph-problem"]))
    else:
        rows = output_rows(recorded_outputs(run),
                           stored_by(db, run.id) if run.kind == "materialize" else [])
        pic = graph_picture.picture(rebuilt.plan, label=_operator_label,
                                    names=user_names(rows))
        shown = f"{pic.total:,} nodes" if pic.shown == pic.total else \
            f"the first {pic.shown:,} of {pic.total:,} nodes"
        kernels = len(rebuilt.plan.fused.nodes)
        groups = len(pic.groups["name"])
        title = (f"{shown}, {kernels:,} kernel{'s' * (kernels != 1)}, {groups:,} fused "
                 f"group{'s' * (groups != 1)}")
        notes = [rebuilt.cluster_note]
        if rebuilt.chunks_differ:
            notes.append(f"these chunk grids differ from the run's ({run.n_chunks:,} chunks): "
                         f"its plan below is what ran")
        parts += [pn.pane.Markdown(LEGEND),
                  Text("; ".join(notes), css_classes=["deepx-graph-notes"]),
                  _scrolled(graph_picture.figure(pic, title))]
    if run.explain:
        parts += [pn.pane.Markdown("### The plan the run recorded"),
                  Text(_first_lines(run.explain, PLAN_LINES))]
    return parts


def _scrolled(fig) -> pn.Column:
    """The picture in a frame as wide as the page and at most VIEW_PX tall, which scrolls
    both ways when the picture is larger: the whole graph is reached, nothing is cut off."""
    # A frame that stretches takes its content's width as its least (Bokeh's layout passes
    # it up to the page, which then grew as wide as the picture): a fixed frame, made as
    # wide as the page by its style, does not.
    return pn.Column(pn.pane.Bokeh(fig), scroll="both-auto", sizing_mode="fixed", width=320,
                     height=min(VIEW_PX, fig.height + 24), css_classes=["deepx-graph-view"],
                     stylesheets=[":host { width: 100% !important; }"])


def _first_lines(text: str, n: int) -> str:
    lines = text.splitlines()
    return text if len(lines) <= n else \
        "\n".join(lines[:n] + [f"... and {len(lines) - n:,} more lines"])


def _operator_label(node) -> str:
    # What the run's task rows call this kernel, so the page and the run page agree.
    from deepx_flow.ir.program import operator_label
    return operator_label(node)


def _lineage(db) -> list:
    newest, usable, more = newest_versions(db)
    states = lineage.asset_states(newest, usable)
    if not states:
        return [Text("no assets materialized yet")]
    nodes, edges, note = lineage.picture(states, when=lambda t: f"{utc_text(t)} UTC")
    counts = {s: sum(1 for a in states.values() if a.state == s) for s in lineage.STATE_COLORS}
    title = f"{len(states):,} assets: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    notes = [note] if note else []
    if more:
        notes.append(f"more than {MAX_TARGETS:,} assets and partitions: drawn from the first "
                     f"{MAX_TARGETS:,} by name")
    parts = [pn.pane.Markdown(LINEAGE_LEGEND)]
    if notes:
        parts.append(Text("; ".join(notes)))
    parts.append(pn.pane.Bokeh(lineage.figure(nodes, edges, title), sizing_mode="stretch_width"))
    return parts
