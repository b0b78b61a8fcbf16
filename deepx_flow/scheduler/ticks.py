"""Which ticks of a schedule are due, and what to do with each: the scheduler's decisions,
kept pure (no clock, no database, no cluster) so tests can drive them with any history.

A tick is a time the schedule's cron expression names, in epoch seconds. The daemon hands
`decide_ticks` the newest tick already decided (`after`; recorded in `schedule_ticks`, or
the time the schedule was first seen) and the time now; every tick in (after, now] gets
exactly one decision, oldest first, and nothing at or before `after` is ever returned again.

The policy:
- a schedule never seen (`after` None) starts now: no history is backfilled;
- catchup="latest" (the default): when several ticks are due at once (the daemon was down,
  or busy), only the newest is launched, and each older one is skipped, naming the tick
  that covers it. A tick that comes while the schedule's previous run is still going is
  skipped: runs of one schedule never overlap and never pile up;
- catchup="all": each due tick is launched once, oldest first; the runs wait their turn
  (one at a time per schedule), so ticks that come during a run are queued, not skipped.
  At most `MAX_QUEUED` runs go or wait; a tick that finds no room is skipped. Within one
  evaluation the newest ticks get the room (after an outage, the oldest due ticks are
  skipped); across evaluations, ticks already queued keep their place, so while the queue
  stays full it is the newly due ticks that are skipped;
- one evaluation decides at most `MAX_TICKS` (the newest) ticks: a daemon that was down a
  year under a per-second cron records the last MAX_TICKS, and the oldest one's reason says
  that older ticks were not recorded.

Deciding a tick is not recording it. `Backlog` holds a schedule's decided ticks that have
no row yet, and lets their rows go in only in tick order (a skip is recorded, a launch
claimed, once it is the oldest tick there). So a daemon never writes a row past a tick it
decided and has not written yet, and the newest recorded tick is always a safe `after` for
the next daemon: every tick after it is either not decided yet or decided and dropped with
the daemon that decided it (stopped or killed), and is decided again. The daemon reads the
newest recorded tick at start, so this rule is what makes a restart lose no tick.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import deque
from dataclasses import dataclass

MAX_QUEUED = 100
MAX_TICKS = 1000


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one tick: launch a run, or skip it (`reason` says why)."""

    tick_at: float
    launch: bool
    reason: str = ""


def decide_ticks(schedule, after: float | None, now: float, *, waiting: int = 0,
                 awake_since: float | None = None, max_queued: int = MAX_QUEUED,
                 max_ticks: int = MAX_TICKS) -> list[Decision]:
    """The decisions for the ticks of `schedule` (a ScheduleDef) in (after, now].

    `waiting` is how many runs of this schedule are going or queued; `awake_since` is when
    the daemon began evaluating (ticks at or before it were missed while no daemon ran; it
    only changes the wording of reasons).
    """
    if after is None:
        return []
    ticks, dropped = cron_times(schedule, after, now, max_ticks)
    if not ticks:
        return []
    tz = schedule.timezone
    if schedule.catchup == "all":
        room = max(0, max_queued - waiting)
        cut = len(ticks) - room
        full = (f"more than {max_queued} runs of this schedule would wait (catchup='all' "
                f"keeps at most {max_queued}); skipped")
        decisions = [Decision(t, False, full) if i < cut else Decision(t, True)
                     for i, t in enumerate(ticks)]
    elif waiting:
        decisions = [Decision(t, False, "previous run still running") for t in ticks]
    else:
        newest = ticks[-1]
        decisions = [Decision(t, False, _covered(t, newest, awake_since, tz))
                     for t in ticks[:-1]] + [Decision(newest, True)]
    if dropped and not decisions[0].launch:
        first = decisions[0]
        decisions[0] = Decision(first.tick_at, False, f"{first.reason}; older ticks since "
                                f"{format_tick(after, tz)} were not recorded (more than "
                                f"{max_ticks} were due)")
    return decisions


class Backlog:
    """One schedule's ticks that a daemon decided and has not written a row for, oldest
    first. A row may be written only for `head()` (record it if a skip, claim it if a
    launch), then `pop()` it: so rows go in in tick order, and the newest row never passes
    a decided tick that has none. Not thread-safe: the daemon holds a lock around it."""

    def __init__(self):
        self._ticks: deque[Decision] = deque()
        self.launches = 0  # launches in it: runs waiting to be claimed

    def add(self, decisions: list[Decision]) -> None:
        """Append decisions of newer ticks than any already here (`decide_ticks` output)."""
        if decisions and self._ticks:
            assert decisions[0].tick_at > self._ticks[-1].tick_at, "ticks out of order"
        self._ticks.extend(decisions)
        self.launches += sum(d.launch for d in decisions)

    def head(self) -> Decision | None:
        """The oldest decided tick without a row: the only one whose row may go in now."""
        return self._ticks[0] if self._ticks else None

    def pop(self) -> Decision:
        """Forget the head, once its row is in (or found already there)."""
        d = self._ticks.popleft()
        self.launches -= d.launch
        return d

    def drop(self) -> list[Decision]:
        """Forget every tick here (a stop): none has a row, so the next daemon decides them
        again."""
        dropped = list(self._ticks)
        self._ticks.clear()
        self.launches = 0
        return dropped

    def __len__(self) -> int:
        return len(self._ticks)


def cron_times(schedule, after: float, until: float,
               limit: int = MAX_TICKS) -> tuple[list[float], bool]:
    """The newest `limit` cron times of `schedule` in (after, until], oldest first, and
    whether older ones in that window were left out."""
    from croniter import croniter

    # Cron times are whole seconds, so the newest one <= until is the one before floor+1.
    start = dt.datetime.fromtimestamp(math.floor(until) + 1, schedule.zone)
    it = croniter(schedule.cron, start)
    found: list[float] = []
    while True:
        t = it.get_prev(float)
        if t <= after:
            return found[::-1], False
        if len(found) == limit:
            return found[::-1], True
        found.append(t)


def next_tick(schedule, after: float) -> float:
    """The first cron time of `schedule` after `after`."""
    from croniter import croniter

    start = dt.datetime.fromtimestamp(after, schedule.zone)
    return croniter(schedule.cron, start).get_next(float)


def format_tick(t: float, timezone: str = "UTC") -> str:
    """A tick time as people read it, in the schedule's time zone."""
    from zoneinfo import ZoneInfo

    return dt.datetime.fromtimestamp(t, ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def _covered(t: float, newest: float, awake_since: float | None, tz: str) -> str:
    why = ("missed while no daemon ran" if awake_since is None or t <= awake_since
           else "came due with newer ticks while the daemon was busy")
    return f"{why}; the tick at {format_tick(newest, tz)} covers it"
