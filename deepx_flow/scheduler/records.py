"""The scheduler's rows in the metadata database: `schedules` (what a daemon runs, its
heartbeat, and when it stopped cleanly) and `schedule_ticks` (one row per schedule and tick
time).

A tick is claimed by inserting its row: the unique (schedule, tick_at) pair lets exactly
one insert succeed, whichever daemon, or whichever life of one daemon, tries. So a run is
started only after its row went in, and a tick whose row exists is never started again.
Each function is one short transaction.
"""

from __future__ import annotations

from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from deepx_flow.errors import DatabaseError
from deepx_flow.meta.models import Schedule, ScheduleTick


def sync_schedules(db, schedules, *, definitions: str, daemon: str,
                   now: float) -> dict[str, float]:
    """Write each schedule's row, naming `daemon` as its runner; returns when each was
    first seen as it is now (`updated_at`: kept while cron, selection and time zone stay
    the same, so a restarted daemon knows how far back its ticks go)."""
    seen = {}
    for s in schedules:
        for attempt in range(2):  # two daemons inserting the same new row: read it again
            try:
                seen[s.name] = _sync_one(db, s, definitions, daemon, now)
                break
            except DatabaseError as err:
                if attempt or not isinstance(err.__cause__, IntegrityError):
                    raise
    return seen


def _sync_one(db, s, definitions: str, daemon: str, now: float) -> float:
    with db.session() as session:
        row = session.get(Schedule, s.name)
        if row is None:
            row = Schedule(name=s.name, cron=s.cron, selection=s.selection,
                           timezone=s.timezone, updated_at=now)
        elif (row.cron, row.selection, row.timezone) != (s.cron, s.selection, s.timezone):
            row.cron, row.selection, row.timezone, row.updated_at = \
                s.cron, s.selection, s.timezone, now
        row.definitions, row.daemon, row.heartbeat_at = definitions, daemon, now
        row.stopped_at = None
        session.add(row)
        return row.updated_at


def schedule_rows(db, names) -> dict[str, Schedule]:
    with db.read() as session:
        rows = session.exec(select(Schedule).where(col(Schedule.name).in_(list(names))))
        return {r.name: r for r in rows}


def last_ticks(db, names) -> dict[str, float]:
    """The newest recorded tick time of each schedule that has one."""
    with db.read() as session:
        rows = session.exec(select(ScheduleTick.schedule, func.max(ScheduleTick.tick_at))
                            .where(col(ScheduleTick.schedule).in_(list(names)))
                            .group_by(ScheduleTick.schedule))
        return {name: at for name, at in rows}


def unfinished_ticks(db, names) -> list[ScheduleTick]:
    """Ticks launched and not finished (their run is going, or their daemon died)."""
    with db.read() as session:
        return list(session.exec(
            select(ScheduleTick).where(col(ScheduleTick.schedule).in_(list(names)),
                                       ScheduleTick.status == "launched",
                                       col(ScheduleTick.finished_at).is_(None))
            .order_by(ScheduleTick.tick_at)))


def claim(db, schedule: str, tick_at: float, *, daemon: str, now: float) -> int | None:
    """Claim a tick for a run: its row's id, or None when the tick is already recorded."""
    return _insert_once(db, ScheduleTick(schedule=schedule, tick_at=tick_at,
                                         status="launched", daemon=daemon, started_at=now))


def record_skip(db, schedule: str, tick_at: float, reason: str, *, daemon: str,
                now: float) -> bool:
    """Record a skipped tick; False when the tick is already recorded."""
    return _insert_once(db, ScheduleTick(schedule=schedule, tick_at=tick_at, status="skipped",
                                         message=reason, daemon=daemon, started_at=now,
                                         finished_at=now)) is not None


def finish(db, tick_id: int, *, status: str, run_id: str | None, message: str,
           now: float) -> None:
    with db.session() as session:
        row = session.get(ScheduleTick, tick_id)
        row.status, row.run_id, row.message, row.finished_at = status, run_id, message, now
        session.add(row)


def heartbeat(db, names, *, daemon: str, now: float) -> None:
    """Mark this daemon alive on the schedules it still runs."""
    with db.session() as session:
        for row in session.exec(select(Schedule).where(col(Schedule.name).in_(list(names)),
                                                       Schedule.daemon == daemon)):
            row.heartbeat_at = now
            session.add(row)


def stopped(db, names, *, daemon: str, now: float) -> None:
    """Record that this daemon stopped cleanly, on the schedules it still runs."""
    with db.session() as session:
        for row in session.exec(select(Schedule).where(col(Schedule.name).in_(list(names)),
                                                       Schedule.daemon == daemon)):
            row.stopped_at = now
            session.add(row)


def _insert_once(db, row: ScheduleTick) -> int | None:
    try:
        with db.session() as session:
            session.add(row)
            session.flush()
            return row.id
    except DatabaseError as err:
        if isinstance(err.__cause__, IntegrityError):
            return None
        raise
