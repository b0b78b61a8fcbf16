"""Staleness: which assets (and partitions) need materializing again, and why.

A target (an asset, or one partition of it) is stale when it was never materialized, when
its newest version failed a blocking check, when its code version differs from the one its
newest usable version was made with, or when something it reads has a newer version than
the one that version read. `dx.status(defs)` prints a row per asset (a partitioned asset
is stale when any of its partitions is); `stale_targets` also counts as stale everything
downstream of a stale target in a materialization (it will change).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from deepx_flow.assets import catalog
from deepx_flow.assets.targets import Target, reads, targets_for
from deepx_flow.meta import open_db
from deepx_flow.text_table import local_time, text_table

# Reasons shown per partitioned asset before "... and N more".
SHOWN_REASONS = 3


@dataclass(frozen=True)
class AssetStatus:
    asset: str
    stale: bool
    reasons: tuple[str, ...]
    version: str | None  # newest usable version (unpartitioned assets)
    materialized_at: float | None
    partitions: tuple[int, int] | None = None  # (materialized, defined) for partitioned ones


@dataclass(frozen=True)
class StatusTable:
    rows: tuple[AssetStatus, ...]

    def __getitem__(self, asset: str) -> AssetStatus:
        for row in self.rows:
            if row.asset == asset:
                return row
        raise KeyError(f"no asset named {asset!r} in this status table")

    def _table(self) -> tuple[tuple, list]:
        return (("asset", "state", "version", "materialized", "why"), [
            (r.asset, "stale" if r.stale else "fresh",
             f"{r.partitions[0]}/{r.partitions[1]} partitions" if r.partitions else
             (r.version or "-")[:12],
             local_time(r.materialized_at), "; ".join(r.reasons)) for r in self.rows])

    def __str__(self) -> str:
        return text_table(*self._table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from deepx_flow.text_table import html_table
        return html_table(*self._table(), "asset status")


class _Latest:
    """Newest versions, each looked up once per status call."""

    def __init__(self, db):
        self.db, self.cache = db, {}

    def __call__(self, t: Target, usable: bool = True):
        if (t, usable) not in self.cache:
            self.cache[t, usable] = catalog.latest(self.db, t.asset, t.partition, usable)
        return self.cache[t, usable]


def target_reasons(defs, t: Target, latest: _Latest, now=None) -> list[str]:
    """Why target `t` is stale (empty when fresh)."""
    a, row, newest = defs[t.asset], latest(t), latest(t, usable=False)
    reasons = []
    if newest is not None and (row is None or newest.version != row.version):
        reasons.append(f"version {newest.version[:12]} failed a blocking check")
    if row is None:
        return reasons or ["never materialized"]
    if a.code_version != row.code_version:
        reasons.append(f"code version {row.code_version!r} -> {a.code_version!r}")
    used = catalog.upstream_versions(row)
    for ups in reads(defs, t, now).values():
        for u in ups:
            current = latest(u)
            if current is not None and used.get(str(u)) != current.version:
                reasons.append(f"upstream {u} has a newer version")
    return reasons


def status(defs, db=None, now=None) -> StatusTable:
    """Fresh or stale, and why, for every asset of `defs`."""
    database = open_db(db)
    latest = _Latest(database)
    now = now or dt.datetime.now(dt.timezone.utc)  # one "now" for every partition asked
    rows = []
    for name in defs.order:
        targets = targets_for(defs, [name], None, now)
        found = {t: target_reasons(defs, t, latest, now) for t in targets}
        made = [latest(t) for t in targets if latest(t) is not None]
        stamp = max((r.created_at for r in made), default=None)
        if defs[name].partitions is None:
            reasons = found[targets[0]]
            row = latest(targets[0])
            rows.append(AssetStatus(name, bool(reasons), tuple(reasons),
                                    row.version if row else None, stamp))
            continue
        stale = [(t, why) for t, why in found.items() if why]
        reasons = [f"[{t.partition}] {'; '.join(why)}" for t, why in stale[:SHOWN_REASONS]]
        if len(stale) > SHOWN_REASONS:
            more = len(stale) - SHOWN_REASONS
            reasons.append(f"and {more} more partition{'s' if more > 1 else ''}")
        rows.append(AssetStatus(name, bool(stale), tuple(reasons), None, stamp,
                                (len(made), len(targets))))
    return StatusTable(tuple(rows))


def stale_targets(defs, targets: list[Target], db, now=None) -> list[Target]:
    """Of `targets` (topological order), those stale now or reading one that is."""
    latest = _Latest(db)
    out: list[Target] = []
    chosen: set[Target] = set()
    for t in targets:
        upstream = [u for ups in reads(defs, t, now).values() for u in ups]
        if any(u in chosen for u in upstream) or target_reasons(defs, t, latest, now):
            out.append(t)
            chosen.add(t)
    return out


__all__ = ["AssetStatus", "StatusTable", "status", "stale_targets", "target_reasons"]
