"""The schedules page: every schedule a daemon runs (its cron, selection, daemon and that
daemon's state: alive, stopped or gone; how many ticks it has and its last), and the ticks,
newest first, with the run each launched (linked to the run's page, with that run's
status).

`schedules?schedule=<name>` opens the page with the ticks of that schedule only.
"""

from __future__ import annotations

import time

import panel as pn
from sqlalchemy import Float, and_, bindparam, case, func
from sqlmodel import col, select

from deepx_flow.meta.models import Run, Schedule, ScheduleTick
from deepx_flow.scheduler.liveness import STALE_AFTER_S
from deepx_flow.ui.data import Listing
from deepx_flow.ui.session import session_arg
from deepx_flow.ui.table import PagedTable

S, T = Schedule, ScheduleTick
STATUSES = ("launched", "skipped", "failed")
MAX_NAMES = 1000  # schedules offered in the filter (schedules live in code: a handful)

# The dashboard cannot see a daemon's process, so it judges a daemon as
# `liveness.daemon_gone` judges one on another host: "stopped" once it recorded a clean
# stop, "alive" while its heartbeat is fresh, else "gone" (it died, or hangs).
# The time is taken when the query runs, so a page left open judges with a current clock.
_NOW = bindparam("now", callable_=time.time, type_=Float)
DAEMON_STATE = case((col(S.stopped_at).is_not(None), "stopped"),
                    (and_(col(S.daemon).is_not(None), col(S.heartbeat_at).is_not(None),
                          col(S.heartbeat_at) >= _NOW - STALE_AFTER_S), "alive"),
                    else_="gone")

# Ticks per schedule: how many, and the newest tick time.
_TICKS = select(T.schedule, func.count().label("ticks"),
                func.max(T.tick_at).label("last")).group_by(T.schedule).subquery()


def _schedules():
    return select(S).outerjoin(_TICKS, _TICKS.c.schedule == S.name)


SCHEDULES = Listing(
    columns={"name": col(S.name), "cron": col(S.cron), "selection": col(S.selection),
             "timezone": col(S.timezone), "ticks": func.coalesce(_TICKS.c.ticks, 0),
             "tick": _TICKS.c.last, "daemon": col(S.daemon), "seen": col(S.heartbeat_at),
             "state": DAEMON_STATE, "definitions": col(S.definitions)},
    default_sort="name", descending=False, source=_schedules, tie=col(S.name))


def _ticks(schedule: str | None = None, status: str | None = None):
    query = select(T).outerjoin(Run, col(Run.id) == col(T.run_id))
    if schedule:
        query = query.where(T.schedule == schedule)
    return query.where(T.status == status) if status else query


TICKS = Listing(
    columns={"schedule": col(T.schedule), "tick": col(T.tick_at), "status": col(T.status),
             "run": col(T.run_id), "run_status": col(Run.status), "message": col(T.message),
             "daemon": col(T.daemon), "started": col(T.started_at),
             "ended": col(T.finished_at)},
    default_sort="tick", descending=True, source=_ticks, tie=col(T.id))


def schedule_names(db, limit: int = MAX_NAMES) -> list[str]:
    """The names of the recorded schedules, in order (the first `limit`)."""
    with db.read() as session:
        return list(session.exec(select(S.name).order_by(S.name).limit(limit)))


def schedules_page(db, scheduler=None):
    names = schedule_names(db)
    wanted = session_arg("schedule")
    schedules = PagedTable(SCHEDULES, db, links={"name": "schedules?schedule="},
                           css_class="deepx-schedules")
    # Each filter offers "any" (no filter: None) and the values it can take.
    schedule = pn.widgets.Select(label="schedule", options={"any": None, **{n: n for n in names}},
                                 value=wanted if wanted in names else None, width=220,
                                 css_classes=["deepx-ticks-schedule"])
    status = pn.widgets.Select(label="status", options={"any": None, **{s: s for s in STATUSES}},
                               value=None, width=160, css_classes=["deepx-ticks-status"])
    ticks = PagedTable(TICKS, db, links={"run": "run?id=", "schedule": "schedules?schedule="},
                       css_class="deepx-ticks", schedule=schedule.value, status=status.value)

    def refilter(_event) -> None:
        ticks.refresh(schedule=schedule.value, status=status.value)

    schedule.param.watch(refilter, "value")
    status.param.watch(refilter, "value")
    return pn.Column(pn.pane.Markdown("## Schedules"), schedules,
                     pn.pane.Markdown("### Ticks"), pn.Row(schedule, status), ticks,
                     sizing_mode="stretch_width")
