"""One run's page (`run?id=...`): what it was, its tasks on a timeline per worker (retries
and drifts in their own colours), its events and errors, its plan, and the work per
operator."""

from __future__ import annotations

import panel as pn

from deepx_flow.errors import InputError
from deepx_flow.meta.queries import find_run, run_events, run_tasks, task_summary
from deepx_flow.ui import timeline
from deepx_flow.ui.table import utc_text

MAX_BARS = 20_000  # a timeline of more tasks shows the first ones (by start) and says so


def run_id_from_session() -> str:
    """The `id` query argument of this browser session ("" when missing)."""
    values = pn.state.session_args.get("id") or [b""]
    return values[0].decode("utf-8", "replace")


def _when(t: float | None) -> str:
    return "-" if t is None else f"{utc_text(t)} UTC"


def run_page(db, scheduler=None):
    wanted = run_id_from_session()
    try:
        run = find_run(db, wanted)
    except InputError as err:
        return pn.Column(pn.pane.Markdown("## Run"), pn.pane.Str(str(err)))
    tasks = run_tasks(db, run.id, limit=MAX_BARS)
    per_operator = task_summary(db, run.id)
    total = sum(count for _, count, *_ in per_operator)
    seconds = "-" if run.ended_at is None else f"{run.ended_at - run.started_at:.3f} s"
    facts = [("status", run.status), ("kind", run.kind), ("started", _when(run.started_at)),
             ("duration", seconds), ("workers", run.n_workers), ("tasks planned", run.n_tasks),
             ("task attempts recorded", total), ("cluster", run.cluster),
             ("host / pid / user", f"{run.host} / {run.pid} / {run.username}"),
             ("compute/communication (planned)",
              "inf (no data moves between workers)" if run.compute_comm_ratio is None
              else f"{run.compute_comm_ratio:.1f}")]
    facts_table = pn.widgets.Tabulator(
        _frame(["what", "value"], [(k, str(v)) for k, v in facts]), disabled=True,
        show_index=False, css_classes=["deepx-run-facts"], sizing_mode="stretch_width")
    cols = timeline.bars(tasks, run.started_at)
    shown = f"{len(tasks):,} of {total:,} task attempts (the first by start)" \
        if total > len(tasks) else f"{total:,} task attempts"
    chart = pn.pane.Bokeh(timeline.figure(cols, f"tasks per worker: {shown}"),
                          sizing_mode="stretch_width")
    events = run_events(db, run.id)
    events_table = pn.widgets.Tabulator(
        _frame(["at", "kind", "worker", "key", "message"],
               [(_when(e.at), e.kind, e.worker or "", e.key or "", e.message or "")
                for e in events]),
        disabled=True, show_index=False, pagination="local", page_size=20,
        css_classes=["deepx-run-events"], sizing_mode="stretch_width")
    per_op = pn.widgets.Tabulator(
        _frame(["operator", "tasks", "failed", "seconds", "bytes out"],
               [tuple(r) for r in per_operator]),
        disabled=True, show_index=False, css_classes=["deepx-run-operators"],
        sizing_mode="stretch_width")
    parts = [pn.pane.Markdown(f"## Run {run.id}"), facts_table]
    if run.error:
        parts += [pn.pane.Markdown("### Error"), pn.pane.Str(run.error)]
    parts += [pn.pane.Markdown("### Timeline"), chart,
              pn.pane.Markdown(f"### Events ({len(events)})"), events_table,
              pn.pane.Markdown("### Work per operator"), per_op]
    if run.explain:
        parts += [pn.pane.Markdown("### Plan"), pn.pane.Str(run.explain)]
    return pn.Column(*parts, sizing_mode="stretch_width")


def _frame(columns, rows):
    import pandas as pd
    return pd.DataFrame(list(rows), columns=columns)
