"""One run's page (`run?id=...`): what it was, its tasks on a timeline per worker (retries
and drifts in their own colours), its events and errors, its outputs (for a
materialization: the assets and checks they stored), its plan, and the work per operator;
for a graph of training steps, the training's loss curve. The page of a running run is read
again every few seconds until the run ends.

"Tasks planned" is the plan's own total, as its recorded text (`Plan.explain`) gives it,
so the facts and the plan below them agree; "tasks submitted" is what the run gave Dask
(`runs.n_tasks`), which also holds a materialization's writes to storage and a training
graph's several steps, and counts an input's tasks as it was given (a file is read inside
the tasks that use it, with no tasks of its own): the facts say which."""

from __future__ import annotations

import math
import re
from urllib.parse import quote

import panel as pn

from deepx_flow.errors import InputError
from deepx_flow.meta.queries import find_run, measured_ratio, task_summary, timeline_rows
from deepx_flow.ui import loss_curve, timeline
from deepx_flow.ui.data import EVENTS, Rows
from deepx_flow.ui.live import refresh_while_open, shown_failures
from deepx_flow.ui.run_outputs import COLUMNS as OUTPUT_COLUMNS
from deepx_flow.ui.run_outputs import output_rows, recorded_outputs, stored_by
from deepx_flow.ui.session import session_arg
from deepx_flow.ui.table import PagedTable, shown, text_table, utc_text
from deepx_flow.ui.text import Text

MAX_BARS = 10_000  # a timeline of more tasks shows the first ones (by start) and says so
PERIOD_MS = 3000  # how often the page of a running run is read again
OPERATOR_COLUMNS = ["operator", "tasks", "failed", "compute s", "fetch s", "bytes out"]
_TOTALS = re.compile(r"^Totals: ([0-9,]+) tasks", re.MULTILINE)


def _when(t: float | None) -> str:
    return "-" if t is None else f"{utc_text(t)} UTC"


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf (no data moved between workers)" if math.isinf(value) else f"{value:.1f}"


def planned_tasks(explain: str | None) -> int | None:
    """The plan's total of tasks, from its recorded text (the "Totals:" line of
    `Plan.explain`); None when the run recorded no plan."""
    found = _TOTALS.search(explain or "")
    return int(found.group(1).replace(",", "")) if found else None


def submitted_text(run, planned: int | None) -> str:
    """The tasks the run gave Dask, and, where the plan's total differs, why."""
    n = f"{run.n_tasks:,}"
    if planned is None or planned == run.n_tasks:
        return n
    if run.kind == "train":
        return (f"{n} (one graph of several training steps, each shard's grouped into one "
                f"task; the plan is one step's)")
    if run.kind == "materialize" and run.n_tasks > planned:
        writes = run.n_tasks - planned
        return f"{n} (the plan's {planned:,} and {writes:,} write{'s' * (writes != 1)} to storage)"
    return (f"{n} (the plan is made before inputs are given, with a task per chunk of "
            f"each; how an input is given decides its tasks: a file is read inside the tasks "
            f"that use it)")


def facts(run, attempts: int, measured: float | None) -> list[tuple[str, str]]:
    """The run's facts table: (what, value) pairs, as text. `measured` is the ratio of its
    tasks' compute seconds to their seconds fetching inputs (None: not recorded)."""
    seconds = "-" if run.ended_at is None else f"{run.ended_at - run.started_at:.3f} s"
    planned = _ratio(math.inf if run.compute_comm_ratio is None else run.compute_comm_ratio)
    tasks = planned_tasks(run.explain)
    rows = [("status", run.status), ("kind", run.kind), ("started", _when(run.started_at)),
            ("duration", seconds), ("workers", run.n_workers),
            ("tasks planned", "-" if tasks is None else f"{tasks:,}"),
            ("tasks submitted", submitted_text(run, tasks)),
            ("task attempts recorded", f"{attempts:,}"), ("cluster", run.cluster),
            ("host / pid / user", f"{run.host} / {run.pid} / {run.username}"),
            ("compute/communication: planned", planned),
            ("compute/communication: measured", _ratio(measured))]
    return [(what, str(value)) for what, value in rows]


def graph_link(run_id: str) -> str:
    """A link to the run's compiled graph; the id is percent-quoted, so it can hold no
    markup."""
    return f'<a href="graph?run={quote(run_id, safe="")}">the compiled graph</a>'


class RunView(pn.viewable.Viewer):
    """The widgets of one run's page; `refresh()` reads the run again and updates them in
    place (the timeline's data source keeps its name, so there is always one)."""

    def __init__(self, db, run):
        super().__init__()
        self.db, self.run_id = db, run.id
        self.facts = text_table(["what", "value"], "deepx-run-facts")
        self.error = Text("", css_classes=["deepx-run-error"])
        self.error_title = pn.pane.Markdown("### Error")
        self.chart = timeline.figure(timeline.bars([], run.started_at))
        self.events_title = pn.pane.Markdown("### Events")
        self.events = PagedTable(EVENTS, db, page_size=20, css_class="deepx-run-events",
                                 run_id=run.id)  # a run can have thousands: paged in SQL
        self.per_operator = text_table(OPERATOR_COLUMNS, "deepx-run-operators")
        self.outputs_title = pn.pane.Markdown("### Outputs")
        self.outputs = PagedTable(Rows(OUTPUT_COLUMNS, [], "output"), page_size=20,
                                  links={"asset": "assets?asset="},
                                  css_class="deepx-run-outputs")
        self.plan = Text("", css_classes=["deepx-run-plan"])
        self.plan_title = pn.pane.Markdown("### Plan")
        self.training_title = pn.pane.Markdown("### Training", visible=False)
        self.training = Text("", css_classes=["deepx-run-training"], visible=False)
        self.loss = loss_curve.figure(*loss_curve.curves({}))
        # The pane is the figure itself in the browser: hiding the pane alone left an empty
        # chart on the page of every run that is no training's.
        self.loss.visible = False
        self.loss_pane = pn.pane.Bokeh(self.loss, sizing_mode="stretch_width", visible=False)
        # Database text goes into Str panes and tables (shown as text), never into Markdown.
        self.layout = pn.Column(
            pn.pane.Markdown("## Run"),
            Text(run.id, css_classes=["deepx-run-id"], styles={"font-size": "1.3em"}),
            pn.pane.HTML(graph_link(run.id), css_classes=["deepx-run-graph"]), self.facts,
            self.error_title, self.error, self.training_title, self.training, self.loss_pane,
            pn.pane.Markdown("### Timeline"),
            pn.pane.Bokeh(self.chart, sizing_mode="stretch_width"), self.events_title,
            self.events, pn.pane.Markdown("### Work per operator"), self.per_operator,
            self.outputs_title, self.outputs, self.plan_title, self.plan,
            sizing_mode="stretch_width")
        self.refresh(run)

    def __panel__(self):
        return self.layout

    def refresh(self, run=None) -> str:
        """Show the run as the database has it now; returns its status."""
        run = run or find_run(self.db, self.run_id)
        tasks = timeline_rows(self.db, run.id, limit=MAX_BARS)
        per_operator = task_summary(self.db, run.id)
        total = self.attempts = sum(count for _, count, *_ in per_operator)
        self.facts.show(facts(run, total, measured_ratio(per_operator)))
        self.error.object = run.error or ""
        self.error.visible = self.error_title.visible = bool(run.error)
        drawn = (f"{len(tasks):,} of {total:,} task attempts (the first by start)"
                 if total > len(tasks) else f"{total:,} task attempts")
        timeline.show(self.chart, timeline.bars(tasks, run.started_at),
                      f"tasks per worker: {drawn}")
        self.events.refresh()
        self.events_title.object = f"### Events ({self.events.total:,})"
        self.per_operator.show([[shown(v, c) for v, c in zip(r, OPERATOR_COLUMNS)]
                                for r in per_operator])
        self._show_outputs(run)
        self.plan.object = run.explain or ""
        self.plan.visible = self.plan_title.visible = bool(run.explain)
        self._show_training(run)
        return run.status

    def _show_outputs(self, run) -> None:
        """Its outputs by name; a materialization's, with the assets and checks they
        stored (the names its plan uses: t0, t0_check0_0, ...)."""
        outputs = recorded_outputs(run)
        stored = stored_by(self.db, run.id) if run.kind == "materialize" else []
        self.outputs.show(Rows(OUTPUT_COLUMNS, output_rows(outputs, stored), "output"))
        self.outputs.visible = self.outputs_title.visible = bool(outputs)

    def _show_training(self, run) -> None:
        """The training this run is one graph of: its progress and loss curve."""
        from deepx_flow.train import records
        training = records.training_of_run(self.db, run.id)
        shown_ = training is not None
        self.training_title.visible = self.training.visible = self.loss_pane.visible = shown_
        self.loss.visible = shown_
        if not shown_:
            return
        self.training.object = (f"training {training.id}: {training.status}, "
                                f"{training.steps_done} of {training.steps} steps, "
                                f"batch {training.batch_size}, {training.optimizer}")
        loss_curve.show(self.loss, *loss_curve.curves(records.metrics(self.db, training.id)))


def run_page(db, scheduler=None):
    try:
        run = find_run(db, session_arg("id"))
    except InputError as err:
        return pn.Column(pn.pane.Markdown("## Run"), Text(str(err)))
    view = RunView(db, run)
    if run.status == "running":
        problem = Text("", css_classes=["deepx-run-refresh"])
        view.layout.append(problem)

        read = shown_failures(view.refresh, problem)

        def refresh():
            if read() not in ("running", None) and callback is not None:
                callback.stop()  # it ended: nothing more will change
        # A run of many tasks takes a while to read: read it less often.
        big = view.attempts > MAX_BARS
        callback = refresh_while_open(refresh, PERIOD_MS * (5 if big else 1))
    return view
