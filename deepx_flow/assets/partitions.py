"""Partitions: an asset made and stored piece by piece, one version per partition key.

`StaticPartitions(["en", "fr"])` has fixed keys; `TimeWindowPartitions(start, cron=...)`
has one key per window between consecutive cron times from `start` up to the last window
that has ended (so today's daily partition appears tomorrow, as in Dagster).
`DailyPartitions`, `HourlyPartitions`, `WeeklyPartitions` and `MonthlyPartitions` are the
common ones.

A partitioned asset's body takes a `partition` parameter (a `Partition`: key, index, and
the window's start and end for time windows) and builds that partition's tensor. With
`partition_axis=k`, the partitions are slices of one tensor along axis k: reading the asset
as a whole (downstream of an unpartitioned asset, or `dx.load(asset)`) concatenates the
newest version of every partition. Without it, each key is a separate tensor.

Each partition is stored and versioned on its own, so a backfill publishes partition by
partition and a failure leaves the others readable.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from deepx_flow.errors import GraphError, InputError

RANGE = "..."  # "first...last" names a range of keys, inclusive


@dataclass(frozen=True)
class Partition:
    """What a partitioned asset's body is told about the partition it builds."""

    key: str
    index: int
    start: dt.datetime | None = None  # time windows: [start, end)
    end: dt.datetime | None = None

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class StaticPartitions:
    keys_: tuple[str, ...]

    def __init__(self, keys):
        keys = tuple(str(k) for k in keys)
        if not keys:
            raise GraphError("StaticPartitions needs at least one key")
        if len(set(keys)) != len(keys):
            raise GraphError(f"StaticPartitions keys repeat: {_repeats(keys)}")
        bad = [k for k in keys if not k or RANGE in k or "/" in k or k in (".", "..")]
        if bad:
            raise GraphError(f"partition key {bad[0]!r} cannot be used: keys are non-empty "
                             f"and hold no '/' or '{RANGE}'")
        object.__setattr__(self, "keys_", keys)

    def keys(self, now: dt.datetime | None = None) -> list[str]:
        return list(self.keys_)

    def partition(self, key: str, now: dt.datetime | None = None) -> Partition:
        return Partition(key, _index(self.keys(), key, self))

    def __str__(self) -> str:
        return f"static [{', '.join(self.keys_)}]"


@dataclass(frozen=True)
class TimeWindowPartitions:
    start: dt.datetime
    cron: str = "0 0 * * *"
    fmt: str = "%Y-%m-%d"
    end: dt.datetime | None = None
    timezone: str = "UTC"

    def __init__(self, start, cron: str = "0 0 * * *", fmt: str = "%Y-%m-%d", end=None,
                 timezone: str = "UTC"):
        from croniter import croniter
        try:
            tz = ZoneInfo(timezone)
        except Exception:
            raise GraphError(f"unknown time zone {timezone!r} for time-window partitions") \
                from None
        if not croniter.is_valid(cron):
            raise GraphError(f"time-window partitions: cannot read cron {cron!r}")
        object.__setattr__(self, "start", _when(start, tz, "start"))
        object.__setattr__(self, "end", None if end is None else _when(end, tz, "end"))
        object.__setattr__(self, "cron", cron)
        object.__setattr__(self, "fmt", fmt)
        object.__setattr__(self, "timezone", timezone)

    def windows(self, now: dt.datetime | None = None) -> tuple[tuple[dt.datetime, dt.datetime],
                                                                ...]:
        """[start, end) of every window that has ended by `now` (and by `end`)."""
        return _windows(self, self._limit(now))

    def keys(self, now: dt.datetime | None = None) -> list[str]:
        return list(_keys(self, self._limit(now)))

    def partition(self, key: str, now: dt.datetime | None = None) -> Partition:
        limit = self._limit(now)
        index = _key_index(self, limit).get(key)
        if index is None:
            _index(list(_keys(self, limit)), key, self)  # raises, listing the keys
        return Partition(key, index, *_windows(self, limit)[index])

    def _limit(self, now: dt.datetime | None) -> dt.datetime:
        tz = ZoneInfo(self.timezone)
        limit = (now or dt.datetime.now(tz)).astimezone(tz)
        return limit if self.end is None else min(limit, self.end)

    def __str__(self) -> str:
        return f"time windows '{self.cron}' from {self.start.strftime(self.fmt)}"


def DailyPartitions(start, end=None, timezone: str = "UTC") -> TimeWindowPartitions:
    return TimeWindowPartitions(start, "0 0 * * *", "%Y-%m-%d", end, timezone)


def HourlyPartitions(start, end=None, timezone: str = "UTC") -> TimeWindowPartitions:
    # Outside UTC an hour repeats when clocks go back: the offset keeps the keys apart.
    fmt = "%Y-%m-%d-%H:00" + ("" if timezone == "UTC" else "%z")
    return TimeWindowPartitions(start, "0 * * * *", fmt, end, timezone)


def WeeklyPartitions(start, end=None, timezone: str = "UTC") -> TimeWindowPartitions:
    return TimeWindowPartitions(start, "0 0 * * 0", "%Y-%m-%d", end, timezone)


def MonthlyPartitions(start, end=None, timezone: str = "UTC") -> TimeWindowPartitions:
    return TimeWindowPartitions(start, "0 0 1 * *", "%Y-%m", end, timezone)


@functools.lru_cache(maxsize=64)
def _windows(partitions: TimeWindowPartitions, limit: dt.datetime):
    """The windows up to `limit`; cached, since a backfill asks for them once per target."""
    from croniter import croniter
    it = croniter(partitions.cron, partitions.start - dt.timedelta(microseconds=1))
    out, lo = [], it.get_next(dt.datetime)
    while True:
        hi = it.get_next(dt.datetime)
        if hi > limit:
            return tuple(out)
        out.append((lo, hi))
        lo = hi


@functools.lru_cache(maxsize=64)
def _keys(partitions: TimeWindowPartitions, limit: dt.datetime) -> tuple[str, ...]:
    keys = tuple(lo.strftime(partitions.fmt) for lo, _ in _windows(partitions, limit))
    if len(set(keys)) != len(keys):
        raise GraphError(f"time-window partitions: format {partitions.fmt!r} gives two "
                         f"windows the same key ({_repeats(list(keys))}); use a finer format "
                         f"(with %z where clocks change)")
    bad = next((k for k in keys if "/" in k or RANGE in k), None)
    if bad is not None:
        raise GraphError(f"time-window partitions: format {partitions.fmt!r} gives key "
                         f"{bad!r}; keys hold no '/' or '{RANGE}'")
    return keys


@functools.lru_cache(maxsize=64)
def _key_index(partitions: TimeWindowPartitions, limit: dt.datetime) -> dict[str, int]:
    return {k: i for i, k in enumerate(_keys(partitions, limit))}


def resolve_keys(partitions, wanted, now: dt.datetime | None = None) -> list[str]:
    """The keys `wanted` names, in partition order: None for all, a key, a list of keys, or
    "first...last" for a range (a backfill)."""
    keys = partitions.keys(now)
    if wanted is None:
        return keys
    if isinstance(wanted, str) and RANGE in wanted:
        first, _, last = wanted.partition(RANGE)
        lo, hi = _index(keys, first.strip(), partitions), _index(keys, last.strip(), partitions)
        if lo > hi:
            raise InputError(f"partition range {wanted!r} runs backwards")
        return keys[lo:hi + 1]
    chosen = {str(wanted)} if isinstance(wanted, str) else {str(k) for k in wanted}
    known = set(keys)
    for key in chosen - known:
        _index(keys, key, partitions)  # raises, listing the keys
    return [k for k in keys if k in chosen]


def _index(keys: list[str], key: str, partitions) -> int:
    try:
        return keys.index(key)
    except ValueError:
        shown = ", ".join(keys[:5]) + (f", ... {keys[-1]}" if len(keys) > 5 else "")
        raise InputError(f"no partition {key!r} in {partitions} (keys: {shown or 'none yet'})") \
            from None


def _when(value, tz: ZoneInfo, what: str) -> dt.datetime:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise GraphError(f"time-window partitions: cannot read {what} {value!r} (use an "
                             f"ISO date like 2026-01-01)") from None
    elif isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, dt.datetime):
        raise GraphError(f"time-window partitions: {what} must be a date, got {value!r}")
    return value.replace(tzinfo=tz) if value.tzinfo is None else value.astimezone(tz)


def _repeats(keys) -> str:
    return ", ".join(sorted({k for k in keys if keys.count(k) > 1}))


__all__ = ["Partition", "StaticPartitions", "TimeWindowPartitions", "DailyPartitions",
           "HourlyPartitions", "WeeklyPartitions", "MonthlyPartitions", "resolve_keys"]
