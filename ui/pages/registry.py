"""The registry page: the operators and their engines, as `deepx-flow ops` lists them (the
installed code's, whether or not the database has registered them yet, and any others it
has), with the speeds measured of them; a cluster's network links
as a matrix of bandwidths, with its workers' storage tiers and the bytes each holds; and
where each chunk of a tensor is. One tab each, built when first opened (`ui/sections.py`).

`registry` opens the operators, `registry?section=network` the links and storage,
`registry?section=placement` (or `registry?tensor=<key>`) the chunk grid.

A cluster is a scheduler on record (the most recently measured one first); the links and the
storage tiers follow the cluster chosen. Only live clusters and workers are offered (running,
and kept seen by their driver's heartbeat: `registry/heartbeat.py`); the "history" box, or
`registry?section=network&history=1`, offers the closed and gone ones too. The chunk grid
shows one tensor, chosen among those the latest runs placed or named by the `tensor` query
argument; it draws at most `registry_reads.MAX_CELLS` placements and says so when there are
more.
"""

from __future__ import annotations

import time

import panel as pn

from deepx_flow.registry.heartbeat import live_since
from deepx_flow.ui import chunk_grid, link_matrix
from deepx_flow.ui import registry_reads as reads
from deepx_flow.ui.data import Rows
from deepx_flow.ui.sections import section_tabs
from deepx_flow.ui.table import PagedTable, size_text, utc_text
from deepx_flow.ui.session import session_arg
from deepx_flow.ui.text import Text

OPERATORS_PAGE = 100  # the built-in operators and a few engines' fit one page
TIER_COLUMNS = ("worker", "status", "tier", "location", "capacity", "held", "chunks", "used %")
HISTORY_LABEL = "closed and gone clusters too (history)"


def registry_page(db, scheduler=None):
    tensor = session_arg("tensor")
    sections = [("operators", "Operators", lambda: _operators(db)),
                ("network", "Network and storage", lambda: _cluster(db, wants_history())),
                ("placement", "Chunk placement", lambda: _placement(db, tensor))]
    wanted = session_arg("section") or ("placement" if tensor else "")
    return pn.Column(pn.pane.Markdown("## Registry"),
                     *section_tabs(sections, wanted, "registry"),
                     sizing_mode="stretch_width")


def _operators(db) -> list:
    """The operators of the installed code (and any others the database registered), as
    `deepx-flow ops` lists them, and the speeds measured of them."""
    from deepx_flow.registry.operators import (engine_notes, installed_engines,
                                               registered_operators)
    registered, installed = registered_operators(), installed_engines()
    rows = reads.operator_rows(registered, installed, reads.recorded_operators(db))
    # Few enough to hold in memory: sorted and paged there.
    table = PagedTable(Rows(reads.OPERATOR_COLUMNS, rows, "name"), page_size=OPERATORS_PAGE,
                       css_class="deepx-operators")
    here = len(registered)
    shown = _count(len(rows), "operator") + ("" if len(rows) == here else
                                              f" ({here:,} installed here)")
    notes = engine_notes(registered, installed)
    speeds, total = reads.speed_rows(db)
    speed_table = PagedTable(Rows(reads.SPEED_COLUMNS, speeds, "operator"), page_size=50,
                             formats={"updated": _utc, "GFLOP/s": _speed, "GB/s": _speed},
                             css_class="deepx-operator-speeds")
    speed_table.visible = bool(speeds)
    measured = (
        "No operator speeds measured yet: they are recorded as runs finish." if not total
        else _count(total, "measured speed") + " (an operator label on a worker, from its "
        "finished tasks)" + ("" if total == len(speeds) else
                             f"; the first {len(speeds):,} by operator"))
    return [Text(shown, css_classes=["deepx-operators-count"]),
            *([Text("\n".join(notes), css_classes=["deepx-operators-notes"])] if notes else []),
            table, pn.pane.Markdown("#### Measured speeds"),
            Text(measured, css_classes=["deepx-operator-speeds-count"]), speed_table]


def _utc(t) -> str:
    return "" if t is None else f"{utc_text(t)} UTC"


def _speed(value) -> str:
    """GFLOP/s or GB/s as `deepx-flow ops` writes them (text, "-", as it is)."""
    return value if isinstance(value, str) else f"{value:.3g}"


def _cluster(db, history: bool = False) -> list:
    """The history box, the cluster chooser, its link matrix and its storage tiers, kept in
    step."""
    show_all = pn.widgets.Checkbox(label=HISTORY_LABEL, value=history,
                                   css_classes=["deepx-cluster-history"])
    none = Text("", css_classes=["deepx-cluster-none"])
    chooser = pn.widgets.Select(label="cluster (scheduler)", options={},
                                css_classes=["deepx-cluster"], width=600)
    chosen = Text("")
    matrix = pn.pane.Bokeh(None)
    matrix_note = Text("")
    # A cluster's tiers are a few per worker: sent whole (up to MAX_TIERS), sorted and paged
    # in the browser, so their one aggregate over the placements runs once per cluster.
    tiers = PagedTable(Rows(TIER_COLUMNS, [], "worker"), page_size=50,
                       formats={"capacity": size_text, "held": size_text},
                       css_class="deepx-storage-tiers")
    tiers_note = Text("", css_classes=["deepx-storage-tiers-count"])
    shown = pn.Column(chooser, chosen,
                      pn.pane.Markdown("#### Network links"), matrix_note, matrix,
                      pn.pane.Markdown("#### Storage tiers (bytes held: chunks in memory, "
                                       "spilled or stored)"), tiers_note, tiers,
                      sizing_mode="stretch_width")

    def show(address: str | None) -> None:
        if not address:
            return
        since = live_since(time.time())
        chosen.object = f"cluster: scheduler {address}"
        rows, total = reads.links(db, address)
        cols = link_matrix.cells(rows)
        matrix.object, matrix.visible = link_matrix.figure(cols), bool(rows)
        n = len(link_matrix.workers(rows))
        matrix_note.object = (
            "no measured links for this cluster (deepx-flow registry probe measures them)"
            if not rows else
            f"{_count(total, 'measured link')} between {_count(n, 'worker')}"
            + (" (cells: GB/s, then latency)" if n <= link_matrix.LABELLED else
               " (hover over a cell for its numbers)")
            + ("" if total == len(rows) else f"; the first {len(rows):,} drawn"))
        rows, total = reads.storage_tiers(db, address, live_since=since,
                                          history=show_all.value)
        tiers.show(Rows(TIER_COLUMNS, [dict(zip(TIER_COLUMNS, (
            r["address"], r["status"], r["tier"], r["location"], r["capacity"], r["held"],
            r["chunks"], reads.used_percent(r["held"], r["capacity"])))) for r in rows],
            "worker"))
        tiers_note.object = (_count(total, "storage tier") if total == len(rows) else
                             f"the first {len(rows):,} of {total:,} storage tiers, by worker")

    def offer(_event=None) -> None:
        """The clusters on offer (the live ones, or all with the history box ticked)."""
        clusters = reads.schedulers(db, live_since=None if show_all.value
                                    else live_since(time.time()))
        if not clusters:
            on_record = len(reads.schedulers(db))
            none.object = ("No cluster registered yet (deepx-flow registry show --scheduler "
                           "ADDRESS, deepx-flow registry probe)." if not on_record else
                           f"No live cluster: {_count(on_record, 'cluster')} on record, "
                           f"closed or gone (tick \"{HISTORY_LABEL}\").")
        none.visible, shown.visible = not clusters, bool(clusters)
        options = {_cluster_label(c): c.address for c in clusters}
        keep = chooser.value if chooser.value in options.values() else None
        offering[0] = True  # the chooser's own watcher stays quiet: shown once, below
        try:
            chooser.options = options
            chooser.visible = len(clusters) > 1
            chooser.value = keep or (clusters[0].address if clusters else None)
        finally:
            offering[0] = False
        show(chooser.value)

    offering = [False]
    offer()
    chooser.param.watch(lambda event: offering[0] or show(event.new), "value")
    show_all.param.watch(offer, "value")
    return [show_all, none, shown]


def wants_history() -> bool:
    """Whether the page was opened with `?history=1` (closed and gone clusters offered)."""
    return session_arg("history").strip().lower() in ("1", "yes", "true", "on")


def _count(n: int, thing: str) -> str:
    return f"{n:,} {thing}" + ("" if n == 1 else "s")


def _cluster_label(c) -> str:
    when = f"measured {utc_text(c.measured_at)}" if c.measured_at is not None \
        else f"seen {utc_text(c.seen_at)}"
    return f"{c.address} ({when} UTC)"


def _placement(db, wanted: str) -> list:
    """The tensor chooser and the chunk grid of the chosen tensor."""
    recent = reads.recent_tensors(db)
    options = {f"{t} ({_count(n, 'placement')})": t for t, n in recent}
    if wanted and wanted not in options.values():
        options = {wanted: wanted, **options}  # named in the URL, older than the listed
    if not options:
        return [Text("No chunk placements recorded yet.")]
    listed = Text(f"tensors placed by the latest {reads.RECENT_RUNS:,} runs, the "
                  f"{reads.MAX_TENSORS} most recent; any other: registry?tensor=<key>")
    chooser = pn.widgets.Select(label="tensor", options=options,
                                value=wanted or recent[0][0], css_classes=["deepx-tensor"],
                                width=600)
    note = Text("", css_classes=["deepx-chunk-note"])
    grid = pn.pane.Bokeh(None)

    def show(tensor: str) -> None:
        rows, total = reads.tensor_placements(db, tensor)
        read = len(rows)
        rows, malformed = chunk_grid.drawable(rows)
        bad = "" if not malformed else (
            f"{_count(len(malformed), 'placement')} with a chunk index that is not whole "
            f"numbers separated by commas (the first: {malformed[0].chunk!r}) not drawn")
        if not rows:
            note.object = f"no chunk of {tensor} is held or lost on record" \
                if not malformed else f"{tensor}: {bad}"
            grid.visible = False
            return
        cols = chunk_grid.cells(rows)
        grid.object, grid.visible = chunk_grid.figure(cols, f"chunks of {tensor}"), True
        chunks = len(set(cols["chunk"]))
        workers = len(set(cols["worker"]))
        note.object = (
            f"{_count(len(rows), 'placement')} of {_count(chunks, 'chunk')} on "
            f"{_count(workers, 'worker')}, coloured by worker"
            + ("" if workers <= chunk_grid.LEGEND_WORKERS else " (hover for which)")
            + "; paler: spilled, paler still: stored, red outline: lost"
            + ("" if total == read else
               f"; only the first {read:,} of {total:,} placements are read")
            + (f"; {bad}" if bad else ""))
        if chunk_grid.axis_labels(cols)[0].endswith("flattened)"):
            note.object += "; axes past the second are flattened into the columns"

    chooser.param.watch(lambda event: show(event.new), "value")
    show(chooser.value)
    return [listed, chooser, note, grid]
