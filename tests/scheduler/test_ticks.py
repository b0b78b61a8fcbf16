"""The pure tick decisions: every tick in a window gets exactly one decision, nothing at or
before the cursor comes back, and the catch-up policies launch what they promise. Checked
against croniter's forward iteration (the decisions walk backwards). And the protocol the
daemon builds on them (decide, write rows in tick order through `Backlog`, claim, stop,
restart after the newest row), run as a model with any interleaving of one or two daemons,
stops and kills: no tick is lost without a row, none is started twice."""

from __future__ import annotations

import bisect
import datetime as dt
from dataclasses import dataclass, field

from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.scheduler.ticks import Backlog, Decision, cron_times, decide_ticks, next_tick

T0 = dt.datetime(2026, 3, 28, 22, 0, tzinfo=dt.timezone.utc).timestamp()  # DST in Europe

crons = st.sampled_from(["* * * * * *", "*/7 * * * * *", "*/5 * * * *", "0 * * * *",
                         "30 2 * * *", "15 1,3 * * 0"])
zones = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"])
catchups = st.sampled_from(["latest", "all"])


def reference(s, after: float, now: float) -> list[float]:
    """Cron times in (after, now], walking forward."""
    it = croniter(s.cron, dt.datetime.fromtimestamp(after, s.zone))
    out = []
    while (t := it.get_next(float)) <= now:
        out.append(t)
    return out


def span_for(cron: str) -> float:
    """A window that holds a few dozen ticks of `cron` at most."""
    return {"* * * * * *": 120, "*/7 * * * * *": 600, "*/5 * * * *": 6 * 3600,
            "0 * * * *": 2 * 86400}.get(cron, 30 * 86400)


@settings(max_examples=150, deadline=None)
@given(cron=crons, tz=zones, catchup=catchups, data=st.data(),
       waiting=st.integers(0, 3), max_queued=st.integers(1, 20), max_ticks=st.integers(1, 60))
def test_each_tick_in_the_window_gets_one_decision(cron, tz, catchup, data, waiting,
                                                    max_queued, max_ticks):
    s = dx.schedule(cron, timezone=tz, catchup=catchup)
    span = span_for(cron)
    after = T0 + data.draw(st.floats(0, span), label="after")
    now = after + data.draw(st.floats(0, span), label="window")
    got = decide_ticks(s, after, now, waiting=waiting, max_queued=max_queued,
                       max_ticks=max_ticks)
    expected = reference(s, after, now)
    ticks = [d.tick_at for d in got]
    assert ticks == expected[-max_ticks:]  # the newest, oldest first, each once
    assert all(after < t <= now for t in ticks)
    launched = [d.tick_at for d in got if d.launch]
    assert all(d.reason for d in got if not d.launch)
    if catchup == "latest":
        assert launched == ([] if waiting or not ticks else [ticks[-1]])
        if waiting:
            assert all("previous run still running" in d.reason for d in got)
    else:  # the newest that fit in the queue, in order
        assert launched == ticks[len(ticks) - min(len(ticks), max(0, max_queued - waiting)):]
    if len(expected) > max_ticks and got and not got[0].launch:
        assert "not recorded" in got[0].reason


@settings(max_examples=60, deadline=None)
@given(cron=crons, tz=zones, catchup=catchups,
       steps=st.lists(st.floats(0, 1), min_size=1, max_size=25))
def test_evaluations_in_sequence_decide_every_tick_once(cron, tz, catchup, steps):
    """A daemon evaluating at any times (short gaps, long outages) decides every tick of the
    whole window exactly once, and with catchup='latest' launches at most one per
    evaluation."""
    s = dx.schedule(cron, timezone=tz, catchup=catchup)
    span = span_for(cron) / 3
    start = cursor = T0
    now = start
    decided = []
    for step in steps:
        now += step * step * span  # mostly short gaps, some long ones
        got = decide_ticks(s, cursor, now, max_ticks=10_000)
        if catchup == "latest":
            assert sum(d.launch for d in got) <= 1
        decided += [d.tick_at for d in got]
        cursor = got[-1].tick_at if got else cursor
    assert decided == reference(s, start, now)


def test_a_schedule_never_seen_starts_now():
    s = dx.schedule("* * * * * *")
    assert decide_ticks(s, None, T0 + 100) == []


def test_latest_skips_missed_ticks_naming_the_one_that_covers_them():
    s = dx.schedule("* * * * * *", catchup="latest")
    got = decide_ticks(s, T0, T0 + 3.5, awake_since=T0 + 2.5)
    assert [(d.tick_at - T0, d.launch) for d in got] == [(1, False), (2, False), (3, True)]
    assert got[0].reason.startswith("missed while no daemon ran; the tick at 2026-03-28 "
                                    "22:00:03 UTC covers it")
    assert got[1].reason.startswith("missed while no daemon ran")
    late = decide_ticks(s, T0, T0 + 2.2, awake_since=T0)  # the daemon ran, but was busy
    assert "while the daemon was busy" in late[0].reason and late[1].launch


def test_all_keeps_at_most_max_queued():
    s = dx.schedule("* * * * * *", catchup="all")
    got = decide_ticks(s, T0, T0 + 10, waiting=1, max_queued=4)
    assert [d.launch for d in got] == [False] * 7 + [True] * 3
    assert "more than 4 runs of this schedule would wait" in got[0].reason


def test_a_long_outage_records_only_the_newest_ticks():
    s = dx.schedule("* * * * * *")
    got = decide_ticks(s, T0, T0 + 365 * 86400, max_ticks=1000)
    assert len(got) == 1000 and got[-1].launch
    assert "older ticks since 2026-03-28 22:00:00 UTC were not recorded" in got[0].reason
    ticks, dropped = cron_times(s, T0, T0 + 5)
    assert ticks == [T0 + i for i in range(1, 6)] and not dropped


def test_time_zones_and_daylight_saving():
    s = dx.schedule("30 2 * * *", timezone="Europe/Berlin")
    # 29 March 2026 has no 02:30 in Berlin; croniter runs that day's tick at 03:00 CEST.
    got = [dt.datetime.fromtimestamp(t, s.zone).isoformat()
           for t in cron_times(s, T0, T0 + 3 * 86400)[0]]
    assert got[0] == "2026-03-29T03:00:00+02:00"
    assert got[1:] == ["2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]
    assert next_tick(s, T0) == dt.datetime.fromisoformat(got[0]).timestamp()


# --- the protocol: decisions, rows in tick order, claims, stops and restarts -----------------


@dataclass
class Life:
    """One daemon's memory, as daemon.py keeps it; a stop or a kill loses all of it."""

    cursor: float
    backlog: Backlog = field(default_factory=Backlog)
    running: float | None = None  # the claimed tick whose run is going


def simulate(s, ops, *, max_queued: int, daemons: int = 1, ordered: bool = True):
    """Play `ops` against a model of the tick table (tick -> status; one row per tick, as the
    unique constraint keeps it) and return (rows, started ticks, the time at the end).

    ops: ("pass", daemon, seconds) moves the clock and runs one pass of that daemon's main
    loop (decide, then record the skips at the head of its backlog); ("claim", daemon, _)
    lets its worker claim the launch at the head when no run is going; ("end", daemon, _)
    ends its run; ("stop", daemon, _) is SIGTERM or SIGKILL (the rows are all that is left,
    both ways) and a restart after the newest row. `ordered=False` is the daemon before
    Backlog: skips recorded as soon as decided, only launches queued.

    With `ordered`, it checks after every op the invariant a restart relies on: every tick
    up to the newest row has a row, so resuming after the newest row loses nothing,
    wherever a stop falls."""
    every = reference(s, T0, T0 + sum(x for op, _, x in ops if op == "pass"))
    rows: dict[float, str] = {}
    started: list[float] = []
    now = T0
    lives = [Life(T0) for _ in range(daemons)]  # the schedule was first seen at T0

    def restart(i):
        lives[i] = Life(max([T0, *rows]))  # daemon.start: the newest row, or when first seen

    def evaluate(life):
        got = decide_ticks(s, life.cursor, now, max_queued=max_queued, max_ticks=10_000,
                           waiting=life.backlog.launches + (life.running is not None))
        if ordered:
            life.backlog.add(got)
        else:
            for d in got:
                if d.launch:
                    life.backlog.add([d])
                else:
                    rows.setdefault(d.tick_at, "skipped")
        life.cursor = got[-1].tick_at if got else life.cursor
        write_skips(life)

    def write_skips(life):
        while (d := life.backlog.head()) is not None and not d.launch:
            rows.setdefault(d.tick_at, "skipped")
            life.backlog.pop()

    def claim(life):
        d = life.backlog.head()
        if life.running is None and d is not None and d.launch:
            if d.tick_at not in rows:  # the insert wins: the run starts after it
                rows[d.tick_at] = "launched"
                started.append(d.tick_at)
                life.running = d.tick_at
            life.backlog.pop()

    for op, i, seconds in ops:
        life = lives[i % daemons]
        if op == "pass":
            now += seconds
            evaluate(life)
        elif op == "claim":
            claim(life)
        elif op == "end":
            life.running = None
        else:
            restart(i % daemons)
        if ordered and rows:  # rows are cron times: count those up to the newest
            assert bisect.bisect_right(every, max(rows)) == len(rows), (op, i, sorted(rows))
    for i in range(daemons):  # stop them all; one more life runs what is due to the end
        restart(i)
    last = lives[0]
    evaluate(last)
    while last.backlog:
        write_skips(last)
        claim(last)
        last.running = None
    return rows, started, now


@settings(max_examples=200, deadline=None)
@given(cron=st.sampled_from(["* * * * * *", "*/7 * * * * *", "*/5 * * * *"]),
       catchup=catchups, max_queued=st.integers(1, 4), daemons=st.integers(1, 2),
       ops=st.lists(st.tuples(st.sampled_from(["pass", "claim", "claim", "end", "stop"]),
                              st.integers(0, 1), st.floats(0, 1)), max_size=50))
def test_no_tick_is_lost_or_run_twice_across_stops(cron, catchup, max_queued, daemons, ops):
    s = dx.schedule(cron, catchup=catchup)
    period = {"* * * * * *": 1, "*/7 * * * * *": 7}.get(cron, 300)
    ops = [(op, i, x * x * 6 * period) for op, i, x in ops]  # mostly short passes
    rows, started, now = simulate(s, ops, max_queued=max_queued, daemons=daemons)
    assert sorted(rows) == reference(s, T0, now)  # every tick has its one row
    assert len(started) == len(set(started))  # and none was started twice
    assert all(rows[t] == "launched" for t in started)


def test_a_full_queue_then_a_stop_loses_queued_ticks_without_ordered_rows():
    """The bug Backlog fixes: catchup='all', T+1 runs and T+2 waits (the queue of 2 is full),
    T+3 and T+4 find no room and are skipped; recorded at once, they put the newest row
    past T+2, and a restart never decides T+2 again: it has no row, and never ran. Written
    in tick order, nothing is lost: the restart resumes after T+1 and decides T+2, T+3 and
    T+4 again (with room for 2 runs, it skips the oldest and runs the other two)."""
    s = dx.schedule("* * * * * *", catchup="all")
    ops = [("pass", 0, 2.5), ("claim", 0, 0), ("pass", 0, 2.0), ("stop", 0, 0)]
    rows, started, now = simulate(s, ops, max_queued=2, ordered=False)
    assert sorted(rows) == [T0 + 1, T0 + 3, T0 + 4] and started == [T0 + 1]
    rows, started, now = simulate(s, ops, max_queued=2)
    assert rows == {T0 + 1: "launched", T0 + 2: "skipped", T0 + 3: "launched",
                    T0 + 4: "launched"}
    assert [t - T0 for t in started] == [1, 3, 4]


def test_backlog_lets_rows_in_only_in_tick_order():
    b = Backlog()
    b.add([Decision(T0 + 1, True), Decision(T0 + 2, False, "full"), Decision(T0 + 3, True)])
    assert b.launches == 2 and len(b) == 3
    assert b.head() == Decision(T0 + 1, True)  # the skip behind it waits for its claim
    assert b.pop().launch and not b.head().launch and b.launches == 1
    b.pop()
    assert b.drop() == [Decision(T0 + 3, True)] and b.launches == 0 and b.head() is None


def test_seconds_are_the_sixth_field_as_the_docs_say():
    # docs/schedules.md: "* * * * * */10" is every ten seconds; "*/10 * * * * *" is every
    # second of minutes 0, 10, 20, ... (a reader once took it for every ten seconds)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()

    def ticks(cron, n=4):
        s, out, t = dx.schedule(cron), [], start
        for _ in range(n):
            t = next_tick(s, t)
            out.append(t - start)
        return out
    assert ticks("* * * * * */10") == [10, 20, 30, 40]
    assert ticks("*/10 * * * * *") == [1, 2, 3, 4]
    assert ticks("*/10 * * * * *", 60)[-2:] == [59, 600]  # 0:00:01 to 0:00:59, then 0:10:00
