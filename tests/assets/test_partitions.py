"""Partitions: keys of static and time-window partitions, backfills that record each
partition, partitioned assets read per partition or whole, and staleness per partition."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.assets import catalog

UTC = dt.timezone.utc
DAYS = dx.DailyPartitions(start="2026-01-01", end="2026-01-06")  # five days
ROWS = 300  # rows per day


def day_values(index: int) -> np.ndarray:
    """What the `events` asset holds for day `index`, in float64."""
    rows = np.arange(ROWS, dtype=np.float64)[:, None] + 1000.0 * index
    return np.broadcast_to(rows, (ROWS, 8)) * np.arange(1, 9, dtype=np.float64)


def pipeline(code="1"):
    @dx.asset(partitions=DAYS, partition_axis=0, code_version=code)
    def events(partition):
        rows = dx.arange(ROWS, dtype="float64").reshape((ROWS, 1)) + 1000.0 * partition.index
        return rows * dx.arange(1, 9, dtype="float64").reshape((1, 8))

    @dx.asset(partitions=DAYS)
    def daily_mean(events):  # partition by partition
        return events.mean(axis=0)

    @dx.asset
    def totals(events):  # all days, read whole
        return events.sum(axis=0)

    return dx.Definitions(assets=[events, daily_mean, totals])


def test_a_backfill_records_each_partition_and_reads_them_back(client, env):
    defs = pipeline()
    done = dx.materialize(defs, "events daily_mean", partitions="2026-01-02...2026-01-04",
                          client=client)
    days = ["2026-01-02", "2026-01-03", "2026-01-04"]
    assert list(done.versions) == [f"events[{d}]" for d in days] + \
        [f"daily_mean[{d}]" for d in days]
    assert len(done.run_ids) == 1  # one graph for the whole backfill
    for i, day in enumerate(days, start=1):
        row = catalog.latest(env, "events", day)
        assert row.partition == day and json.loads(row.shape) == [ROWS, 8]
        np.testing.assert_array_equal(dx.run(dx.load("events", partition=day),
                                             client=client), day_values(i))
        mean = catalog.latest(env, "daily_mean", day)
        assert json.loads(mean.upstream_versions) == {f"events[{day}]": row.version}
        np.testing.assert_allclose(dx.run(dx.load("daily_mean", partition=day),
                                          client=client), day_values(i).mean(axis=0),
                                   rtol=1e-12)

    table = dx.status(defs)
    assert table["events"].stale and table["events"].partitions == (3, 5)
    assert "[2026-01-01] never materialized" in table["events"].reasons
    with pytest.raises(dx.InputError, match="partitions 2026-01-01, 2026-01-05 have never "
                                            "been materialized: materialize them first"):
        dx.materialize(defs, "totals", client=client)
    with pytest.raises(dx.InputError, match="is partitioned: give partition=KEY"):
        dx.load("events")

    # only_stale fills in the two missing days, and the whole-reading asset after them.
    rest = dx.materialize(defs, only_stale=True, client=client)
    assert list(rest.versions) == ["events[2026-01-01]", "events[2026-01-05]",
                                   "daily_mean[2026-01-01]", "daily_mean[2026-01-05]",
                                   "totals"]
    whole = np.concatenate([day_values(i) for i in range(5)])
    np.testing.assert_array_equal(dx.run(dx.load(defs["events"]), client=client), whole)
    np.testing.assert_allclose(dx.run(dx.load("totals"), client=client), whole.sum(axis=0),
                               rtol=1e-12)
    used = json.loads(catalog.latest(env, "totals").upstream_versions)
    assert sorted(used) == [f"events[2026-01-0{d}]" for d in range(1, 6)]
    assert all(not r.stale for r in dx.status(defs).rows)

    # A new code version makes every partition stale; one day re-made leaves four stale.
    changed = pipeline(code="2")
    dx.materialize(changed, "events", partitions="2026-01-03", client=client)
    table = dx.status(changed)
    assert table["events"].stale and table["events"].partitions == (5, 5)
    stale = dx.materialize(changed, "events", only_stale=True, partitions=None,
                           client=client)
    assert sorted(stale.versions) == [f"events[2026-01-0{d}]" for d in (1, 2, 4, 5)]
    assert dx.status(changed)["totals"].stale  # its upstream partitions are newer


def test_static_partitions_are_separate_tensors(client, env):
    langs = dx.StaticPartitions(["en", "fr", "de"])

    @dx.asset(partitions=langs)
    def vocab(partition):
        return dx.full((10 + partition.index,), float(partition.index))

    defs = dx.Definitions(assets=[vocab])
    done = dx.materialize(defs, partitions=["de", "en"], client=client)
    assert list(done.versions) == ["vocab[en]", "vocab[de]"]  # in partition order
    assert dx.run(dx.load("vocab", partition="de"), client=client).tolist() == [2.0] * 12
    with pytest.raises(dx.InputError, match="partition 'fr' of asset 'vocab' has no stored"):
        dx.load("vocab", partition="fr")

    @dx.asset
    def reader(vocab):
        return vocab

    with pytest.raises(dx.GraphError, match="reads vocab, whose partitions are separate "
                                            "tensors"):
        dx.Definitions(assets=[vocab, reader])


def test_partition_selection_errors(client, env):
    defs = pipeline()
    with pytest.raises(dx.InputError, match="asset events: no partition '2026-02-01'"):
        dx.materialize(defs, "events", partitions="2026-02-01", client=client)
    with pytest.raises(dx.InputError, match="runs backwards"):
        dx.materialize(defs, "events", partitions="2026-01-04...2026-01-02", client=client)
    with pytest.raises(dx.InputError, match="no selected asset is partitioned"):
        dx.materialize(defs, "totals", partitions="2026-01-01", client=client)
    with pytest.raises(dx.GraphError, match="takes a 'partition' parameter but has no "
                                            "partitions"):
        @dx.asset
        def lost(partition):
            return dx.ones((1,))
    with pytest.raises(dx.GraphError, match="repeat: a"):
        dx.StaticPartitions(["a", "b", "a"])
    with pytest.raises(dx.GraphError, match="cannot read cron"):
        dx.TimeWindowPartitions("2026-01-01", cron="every day")


def test_time_windows_end_with_the_last_finished_window():
    days = dx.DailyPartitions(start="2026-03-01")
    now = dt.datetime(2026, 3, 4, 12, 0, tzinfo=UTC)
    assert days.keys(now) == ["2026-03-01", "2026-03-02", "2026-03-03"]
    p = days.partition("2026-03-02", now)
    assert (p.index, p.start.day, p.end.day) == (1, 2, 3)
    hours = dx.HourlyPartitions(start="2026-03-01T22:00")
    assert hours.keys(dt.datetime(2026, 3, 2, 1, 30, tzinfo=UTC)) == \
        ["2026-03-01-22:00", "2026-03-01-23:00", "2026-03-02-00:00"]
    months = dx.MonthlyPartitions(start="2025-11-15")  # the first whole month is December
    assert months.keys(dt.datetime(2026, 3, 1, tzinfo=UTC)) == ["2025-12", "2026-01",
                                                                "2026-02"]


@given(start=st.datetimes(min_value=dt.datetime(2020, 1, 1), max_value=dt.datetime(2030, 1, 1)),
       span_hours=st.integers(0, 24 * 40),
       cron=st.sampled_from(["0 0 * * *", "0 * * * *", "30 6 * * 1", "0 0 1 * *"]))
def test_windows_tile_time_without_gaps(start, span_hours, cron):
    windows = dx.TimeWindowPartitions(start, cron=cron, fmt="%Y-%m-%dT%H:%M").windows(
        start.replace(tzinfo=UTC) + dt.timedelta(hours=span_hours))
    now = start.replace(tzinfo=UTC) + dt.timedelta(hours=span_hours)
    for (lo, hi), (lo2, _) in zip(windows, windows[1:]):
        assert lo < hi == lo2  # contiguous, in order
    assert all(lo >= start.replace(tzinfo=UTC) and hi <= now for lo, hi in windows)
