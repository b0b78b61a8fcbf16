"""`deepx-flow scheduler -m MODULE --list`: each schedule with its next ticks, so the meaning
of a cron is there to read; it starts no cluster and opens no database."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest

from deepx_flow.cli.main import main

MODULE = """\
import deepx_flow as dx


@dx.asset
def a():
    return dx.arange(4, dtype="float64")


defs = dx.Definitions(assets=[a], schedules=[
    dx.schedule("*/10 * * * * *", "a", name="minutes_ending_in_0"),
    dx.schedule("* * * * * */10", "a", name="every_ten_seconds"),
    dx.schedule("30 2 * * 1-5", "a", name="weekdays", timezone="Europe/Berlin",
                only_stale=True),
])
"""


def listed(text: str) -> dict[str, list[dt.datetime]]:
    """Tick times by schedule name, read back from the listing."""
    out, name = {}, None
    for line in text.splitlines():
        if not line.startswith(" "):
            name = line.split(":")[0]
            out[name] = []
            continue
        stamp = re.match(r"  next (\S+ \S+) (\S+)", line)
        out[name].append(dt.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
    return out


def test_the_listing_shows_what_each_cron_means(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pipeline.py").write_text(MODULE)
    before = dt.datetime.now(dt.timezone.utc)
    assert main(["scheduler", "-m", "pipeline.py", "--list", "--ticks", "12"]) == 0
    text = capsys.readouterr().out
    ticks = listed(text)
    assert set(ticks) == {"minutes_ending_in_0", "every_ten_seconds", "weekdays"}
    assert all(len(t) == 12 for t in ticks.values())
    # Seconds are croniter's sixth field: "*/10 * * * * *" is every second of minutes
    # 0, 10, 20, ...; "* * * * * */10" every ten seconds.
    first = ticks["minutes_ending_in_0"]
    assert all(t.minute % 10 == 0 for t in first)
    # One second apart within such a minute; from its last second to the next one's first.
    assert all((b - a).total_seconds() == 1 or (a.second, b.second) == (59, 0)
               for a, b in zip(first, first[1:]))
    assert sum((b - a).total_seconds() == 1 for a, b in zip(first, first[1:])) >= 10
    ten = ticks["every_ten_seconds"]
    assert all(t.second % 10 == 0 for t in ten)
    assert all((b - a).total_seconds() == 10 for a, b in zip(ten, ten[1:]))
    assert ten[0] > before.replace(tzinfo=None) - dt.timedelta(seconds=1)
    weekdays = ticks["weekdays"]
    assert all(t.weekday() < 5 and (t.hour, t.minute, t.second) == (2, 30, 0)
               for t in weekdays)
    assert len({t.date() for t in weekdays}) == 12
    berlin = [line for line in text.splitlines() if line.startswith("  next")][-1]
    assert berlin.split()[3] in ("CET", "CEST")  # in the schedule's own zone
    assert "materializes a, only what is stale" in text
    assert "(+10 s)" in text and "(+1 day)" in text
    assert not (tmp_path / ".deepx").exists()  # no database opened, nothing started


def test_bad_tick_count_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pipeline.py").write_text(MODULE)
    assert main(["scheduler", "-m", "pipeline.py", "--list", "--ticks", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ticks must be between 1 and" in err


@pytest.mark.parametrize("seconds,words", [(10, "10 s"), (300, "5 min"), (5400, "1 h 30 min"),
                                           (86400, "1 day"), (3 * 86400 + 60, "3 days 1 min")])
def test_gaps_read_as_people_say_them(seconds, words):
    from deepx_flow.cli.scheduler_cmd import _duration
    assert _duration(seconds) == words
