"""The overview page (the dashboard's home): the cluster's workers and GPUs with the memory
they use against what they registered, the latest runs, the runs in flight, recent failures,
and a link to Dask's own dashboard; refreshed every two seconds while the page is open.

The workers come from the registry (tables `workers`, `devices`, `storage_tiers`) joined
with the scheduler's live report when a scheduler is given (`scheduler_watch`: read in a
background thread, so a slow or dead scheduler never holds up the server). Without one, or
when it cannot be reached, the page says so and shows the registered rows only. The joining
and formatting is pure (`ui/cluster_state.py`); this module reads and draws.

Only live workers are shown: registered ones whose driver's heartbeat keeps them seen
(`registry/heartbeat.py`), and those the scheduler read reports now. The "history" box
(or `?history=1`) shows the gone ones too, marked gone. When nothing is live (no scheduler
given, and the driver that used the cluster has exited: a script's embedded cluster), the
last cluster on record is shown, its workers marked gone, so the page is never empty for a
project that has run something.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, replace

import panel as pn
from sqlalchemy import and_, func, not_, or_
from sqlmodel import col, select

from deepx_flow.meta.models import Device, Run, StorageTier, Task, Worker
from deepx_flow.registry.heartbeat import live_since
from deepx_flow.ui import cluster_state as cs
from deepx_flow.ui.data import RUNS, Listing, Rows
from deepx_flow.ui.live import failure_text, refresh_while_open
from deepx_flow.ui.scheduler_watch import Reading, watch
from deepx_flow.ui.session import session_arg
from deepx_flow.ui.table import PagedTable, utc_text
from deepx_flow.ui.text import Text

PERIOD_MS = 2000
MAX_WORKERS = 1000  # registered workers shown (a cluster has one per GPU, so far fewer)
RECENT_RUNS = 50  # erred tasks are looked for in the latest runs only (tasks: millions)
PAGE_SIZE = 10
NO_WORKER = "(no workers)"
NO_GPU = "No GPU is registered for these workers or reported by them."
HISTORY_LABEL = "show gone workers too (history)"


@dataclass(frozen=True)
class FirstLines(Listing):
    """A listing whose `first_line` columns show only the first line of their text (an
    error's traceback would not fit in a row; the run page shows all of it)."""

    first_line: tuple = ()

    def page(self, db, *args, **kwargs):
        page = super().page(db, *args, **kwargs)
        rows = [{**r, **{c: cs.first_line(r[c]) for c in self.first_line}} for r in page.rows]
        return replace(page, rows=rows)


def _runs_with(status: str):
    return lambda: select(Run).where(Run.status == status)


IN_FLIGHT = Listing(
    columns={"id": col(Run.id), "kind": col(Run.kind), "started": col(Run.started_at),
             "tasks": col(Run.n_tasks), "workers": col(Run.n_workers),
             "cluster": col(Run.cluster), "host": col(Run.host), "user": col(Run.username)},
    default_sort="started", descending=True, source=_runs_with("running"), tie=col(Run.id))

FAILED_RUNS = FirstLines(
    columns={"id": col(Run.id), "kind": col(Run.kind), "started": col(Run.started_at),
             "ended": col(Run.ended_at), "error": col(Run.error)},
    default_sort="started", descending=True, source=_runs_with("failed"), tie=col(Run.id),
    first_line=("error",))


def _erred_tasks():
    # Only the latest runs' tasks: found through the tasks' (run_id, key) index, where a
    # filter on status alone would read every task row on each refresh.
    recent = select(Run.id).order_by(col(Run.started_at).desc()).limit(RECENT_RUNS)
    return select(Task).where(Task.status == "erred", col(Task.run_id).in_(recent))


LATEST_RUNS = FirstLines(**{f: getattr(RUNS, f) for f in ("columns", "default_sort",
                                                            "descending", "source", "tie")},
                         first_line=("error",))  # the runs page's listing, errors in a line

ERRED_TASKS = FirstLines(
    columns={"at": col(Task.stop), "run": col(Task.run_id), "operator": col(Task.operator),
             "worker": col(Task.worker), "key": col(Task.key), "attempts": col(Task.attempts),
             "error": col(Task.error)},
    default_sort="at", descending=True, source=_erred_tasks, tie=col(Task.id),
    first_line=("error",))


@dataclass(frozen=True)
class Registered:
    """What the registry holds on the cluster: `workers` and their `gpus` (rows as
    `cluster_state` takes them; a row's `gone` says it is not live), how many workers
    there are in all (`total`, of which at most MAX_WORKERS are read), whether they are
    every scheduler's (`everywhere`), how many gone ones are not shown (`hidden`), and,
    when they are the last cluster on record shown for want of a live one, its scheduler
    and when its workers were last seen (`last_known`)."""

    workers: list[dict]
    gpus: list[dict]
    total: int
    everywhere: bool
    hidden: int = 0
    last_known: tuple[str, float] | None = None  # (scheduler, last seen): see shown_cluster


def registered_cluster(db, scheduler: str | None, history: bool = False,
                       seen_live=(), now: float | None = None) -> Registered:
    """The registered workers by address: those of `scheduler`; every scheduler's when it is
    None or has none registered under that spelling of its address (a name where the
    registry has an IP, say), so the page never comes up empty for that. Only the live ones
    (running and seen within the heartbeat timeout at `now`, or in `seen_live`: addresses
    the scheduler reports now), unless `history`."""
    now = time.time() if now is None else now
    key = cs.scheduler_key(scheduler) if scheduler else None
    live = or_(and_(Worker.status == "running", col(Worker.last_seen) >= live_since(now)),
               and_(Worker.scheduler == key, col(Worker.address).in_(sorted(seen_live))))
    with db.read() as session:
        everywhere = not scheduler or not session.exec(
            select(func.count()).select_from(Worker).where(Worker.scheduler == key)).one()
        where = [] if everywhere else [Worker.scheduler == key]
        shown_where = where if history else where + [live]
        shown = select(Worker.id).where(*shown_where).order_by(Worker.address) \
            .limit(MAX_WORKERS)
        total = session.exec(select(func.count()).select_from(Worker)
                             .where(*shown_where)).one()
        hidden = 0 if history else session.exec(
            select(func.count()).select_from(Worker).where(*where, not_(live))).one()
        workers = session.exec(select(Worker, live.label("live"))
                               .where(col(Worker.id).in_(shown))
                               .order_by(Worker.address, Worker.id)).all()
        tiers = session.exec(select(StorageTier.worker_id, StorageTier.tier,
                                    StorageTier.capacity)
                             .where(col(StorageTier.worker_id).in_(shown))
                             .order_by(StorageTier.worker_id, StorageTier.id)).all()
        devices = session.exec(select(Device, Worker.address)
                               .join(Worker, Device.worker_id == Worker.id)
                               .where(col(Device.worker_id).in_(shown))
                               .order_by(Worker.address, Device.index, Device.id)).all()
    tiers_of: dict[int, list] = {}
    for worker_id, tier, capacity in tiers:
        tiers_of.setdefault(worker_id, []).append((tier, capacity))
    rows = [{"address": w.address, "scheduler": w.scheduler, "name": w.name, "host": w.host,
             "nthreads": w.nthreads, "memory_limit": w.memory_limit,
             "storage": cs.storage_text(tiers_of.get(w.id, [])), "gone": not is_live}
            for w, is_live in workers]
    gpus = [{"worker": address, "index": d.index, "name": d.name,
             "memory_total": d.memory_total, "healthy": d.healthy} for d, address in devices]
    return Registered(rows, gpus, int(total), bool(everywhere), int(hidden))


def last_cluster(db) -> tuple[str, float] | None:
    """The scheduler whose registered workers were seen last, and when (None: none
    registered)."""
    seen = func.max(Worker.last_seen)
    with db.read() as session:
        found = session.exec(select(Worker.scheduler, seen).group_by(Worker.scheduler)
                             .order_by(seen.desc(), Worker.scheduler).limit(1)).first()
    return (found[0], float(found[1])) if found else None


def shown_cluster(db, scheduler: str | None, history: bool = False, seen_live=(),
                  now: float | None = None) -> Registered:
    """`registered_cluster`; when it finds no live worker and the scheduler reports none,
    the last cluster on record instead (all its workers, marked gone: `last_known` says
    which it is), so a project whose driver has exited still shows where it ran."""
    found = registered_cluster(db, scheduler, history, seen_live, now)
    if found.workers or seen_live or history:
        return found
    last = last_cluster(db)
    if last is None:
        return found
    shown = registered_cluster(db, last[0], True, (), now)
    return replace(shown, last_known=last)


def workers_note(scheduler: str | None, registered: Registered) -> str:
    """What the workers table holds, when that is not simply the scheduler's workers."""
    if registered.last_known:
        address, seen = registered.last_known
        return (f"No live workers: the last cluster on record is shown, {address} (its "
                f"workers last seen {utc_text(seen)} UTC; the history box lists every "
                f"cluster's).")
    notes = []
    if scheduler and registered.everywhere:
        notes.append(f"No worker is registered under {scheduler}: every scheduler's "
                     f"registered workers are shown.")
    if registered.total > len(registered.workers):
        notes.append(f"{len(registered.workers):,} of {registered.total:,} registered "
                     f"workers shown (by address).")
    if registered.hidden:
        notes.append(f"{registered.hidden:,} registered worker"
                     f"{'s' * (registered.hidden != 1)} of closed or gone clusters not "
                     f"shown (tick \"{HISTORY_LABEL}\").")
    return " ".join(notes)


def scheduler_text(scheduler: str | None, reading: Reading | None) -> str:
    """What the page says of the scheduler it reads."""
    if not scheduler:
        return ("No Dask scheduler given (deepx-flow ui --scheduler ADDRESS, or "
                "DEEPX_SCHEDULER): the workers below are as registered; memory in use is "
                "not known.")
    if reading is None or reading.at == 0:
        return f"Reading the Dask scheduler at {scheduler} ..."
    if reading.error:
        return f"{reading.error}: the workers below are as registered; memory in use is " \
               f"not known (tried {utc_text(reading.at)} UTC)."
    n = len((reading.identity or {}).get("workers") or {})
    return f"Dask scheduler {scheduler}: {n} worker{'s' * (n != 1)} live " \
           f"(read {utc_text(reading.at)} UTC)."


def dashboard_link_html(url: str | None) -> str:
    """The link to Dask's dashboard: fixed HTML around a URL that `dashboard_url` built from
    a parsed host and an int port (escaped all the same)."""
    if url is None:
        return "<p>Dask's own dashboard: not known (no scheduler read).</p>"
    text = html.escape(url.removeprefix("http://").removesuffix("/status"))
    return (f'<p>Dask\'s own dashboard: <a class="deepx-dask-dashboard" '
            f'href="{html.escape(url, quote=True)}" target="_blank" rel="noopener">'
            f'{text}</a></p>')


class Overview(pn.viewable.Viewer):
    """The page's widgets and their refresh; `refresh()` reads everything again and shows
    a failure in the page instead of raising it."""

    def __init__(self, db, scheduler: str | None):
        super().__init__()
        self.db, self.scheduler = db, scheduler
        self.watch = watch(cs.scheduler_key(scheduler)) if scheduler else None
        self.scheduler_status = Text("", css_classes=["deepx-overview-scheduler"])
        self.dask_link = pn.pane.HTML(dashboard_link_html(None),
                                      css_classes=["deepx-overview-dask"])
        self.history = pn.widgets.Checkbox(label=HISTORY_LABEL, value=wants_history(),
                                           css_classes=["deepx-overview-history"])
        self.workers = _table(cs.WORKER_COLUMNS, "deepx-overview-workers", "worker")
        self.workers_note = Text("", css_classes=["deepx-overview-workers-note"])
        self.gpus = _table(cs.GPU_COLUMNS, "deepx-overview-gpus", "worker")
        self.gpus_note = Text("", css_classes=["deepx-overview-gpus-note"])
        self.chart, self.source = _memory_chart()
        self.latest_runs = PagedTable(LATEST_RUNS, db, PAGE_SIZE, links={"id": "run?id="},
                                      css_class="deepx-overview-latest-runs")
        self.in_flight = PagedTable(IN_FLIGHT, db, PAGE_SIZE, links={"id": "run?id="},
                                    css_class="deepx-overview-inflight")
        self.failed_runs = PagedTable(FAILED_RUNS, db, PAGE_SIZE, links={"id": "run?id="},
                                      css_class="deepx-overview-failed-runs")
        self.erred_tasks = PagedTable(ERRED_TASKS, db, PAGE_SIZE, links={"run": "run?id="},
                                      css_class="deepx-overview-erred-tasks")
        self.refreshed = Text("", css_classes=["deepx-overview-refreshed"])
        reading = self.watch.current() if self.watch else None
        self._show_cluster(reading)
        self.layout = pn.Column(
            pn.pane.Markdown("## Overview"), self.scheduler_status, self.dask_link,
            pn.pane.Markdown("### Workers"), self.history, self.workers, self.workers_note,
            pn.pane.Bokeh(self.chart, sizing_mode="stretch_width"),
            pn.pane.Markdown("### GPUs"), self.gpus, self.gpus_note,
            pn.pane.Markdown("### Latest runs"), self.latest_runs,
            pn.pane.Markdown("### Runs in flight"), self.in_flight,
            pn.pane.Markdown("### Recent failures"), pn.pane.Markdown("Failed runs:"),
            self.failed_runs,
            pn.pane.Markdown(f"Failed tasks (in the latest {RECENT_RUNS} runs):"),
            self.erred_tasks, self.refreshed, sizing_mode="stretch_width",
            css_classes=["deepx-overview"])
        self.history.param.watch(lambda _event: self._show_cluster(self._reading()), "value")

    def __panel__(self):
        return self.layout

    def _reading(self) -> Reading | None:
        return self.watch.latest() if self.watch else None

    def refresh(self) -> None:
        try:
            if self.watch:
                self.watch.request()  # read in the background; shown at the next refresh
            self._show_cluster(self._reading())
            for table in (self.latest_runs, self.in_flight, self.failed_runs,
                          self.erred_tasks):
                table.refresh()
            self.refreshed.object = f"refreshed {utc_text(time.time())} UTC"
        except Exception as err:  # a page that stops refreshing must say why, not vanish
            self.refreshed.object = failure_text(err)

    def _show_cluster(self, reading: Reading | None) -> None:
        live = cs.live_workers(reading.identity) if reading and reading.identity else None
        registered = shown_cluster(self.db, self.scheduler, self.history.value,
                                   seen_live=live or ())
        _set(self.workers, cs.worker_rows(registered.workers, live, self.scheduler))
        gpus = cs.gpu_rows(registered.gpus, live)
        _set(self.gpus, gpus)
        self.gpus.visible = bool(gpus)
        self.gpus_note.object = "" if gpus else NO_GPU
        self.workers_note.object = workers_note(self.scheduler, registered)
        cols = cs.memory_columns(registered.workers, live)
        if cols != dict(self.source.data):
            self.chart.y_range.factors = list(reversed(cols["worker"])) or [NO_WORKER]
            self.chart.height = max(160, 60 + 28 * len(cols["worker"]))
            self.source.data = cols
        self.scheduler_status.object = scheduler_text(self.scheduler, reading)
        url = None
        if reading and reading.identity:
            url = cs.dashboard_url(self.scheduler, cs.dashboard_port(reading.identity))
        link = dashboard_link_html(url)
        if link != self.dask_link.object:
            self.dask_link.object = link


def wants_history() -> bool:
    """Whether the page was opened with `?history=1` (gone workers shown too)."""
    return session_arg("history").strip().lower() in ("1", "yes", "true", "on")


def _table(columns, css_class: str, sort: str) -> PagedTable:
    # Pages of 16 rows, sorted on the server: the browser draws one page.
    return PagedTable(Rows(tuple(columns), [], sort), page_size=16, css_class=css_class)


def _set(table: PagedTable, rows: list[dict]) -> None:
    table.show(replace(table.listing, rows=rows))


def _memory_chart():
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    source = ColumnDataSource(cs.memory_columns([], None), name="overview-memory-source")
    fig = figure(y_range=[NO_WORKER], height=220, sizing_mode="stretch_width",
                 title="memory per worker: used now (dark) vs registered limit (light), GiB",
                 x_axis_label="GiB", tools="xpan,xwheel_zoom,reset", name="overview-memory")
    fig.hbar(y="worker", left=0, right="registered_gib", height=0.8, color="#c6dbef",
             source=source)
    fig.hbar(y="worker", left=0, right="used_gib", height=0.45, color="#4c78a8",
             source=source)
    fig.add_tools(HoverTool(tooltips=[("worker", "@worker"), ("used", "@used_gib{0.00} GiB"),
                                      ("registered", "@registered_gib{0.00} GiB")]))
    fig.ygrid.grid_line_color = None
    return fig, source


def overview_page(db, scheduler=None):
    overview = Overview(db, scheduler)
    refresh_while_open(overview.refresh, PERIOD_MS)
    return overview
