"""The pure tick decisions: every tick in a window gets exactly one decision, nothing at or
before the cursor comes back, and the catch-up policies launch what they promise. Checked
against croniter's forward iteration (the decisions walk backwards)."""

from __future__ import annotations

import datetime as dt

from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.scheduler.ticks import cron_times, decide_ticks, next_tick

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
