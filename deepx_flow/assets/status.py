"""Staleness: which assets need materializing again, and why.

An asset is stale when it was never materialized, when its code version differs from the
one its latest version was made with, or when an upstream asset has a newer version than the
one its latest version read. `dx.status(defs)` prints a row per asset; `stale_assets` also
counts as stale everything downstream of a stale asset in a selection (it will change).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from deepx_flow.assets import catalog
from deepx_flow.meta import open_db
from deepx_flow.text_table import text_table


@dataclass(frozen=True)
class AssetStatus:
    asset: str
    stale: bool
    reasons: tuple[str, ...]
    version: str | None
    materialized_at: float | None


@dataclass(frozen=True)
class StatusTable:
    rows: tuple[AssetStatus, ...]

    def __getitem__(self, asset: str) -> AssetStatus:
        return next(r for r in self.rows if r.asset == asset)

    def __str__(self) -> str:
        return text_table(("asset", "state", "version", "materialized", "why"), [
            (r.asset, "stale" if r.stale else "fresh", (r.version or "-")[:12],
             dt.datetime.fromtimestamp(r.materialized_at).strftime("%Y-%m-%d %H:%M:%S")
             if r.materialized_at else "-", "; ".join(r.reasons)) for r in self.rows])

    __repr__ = __str__


def status(defs, db=None) -> StatusTable:
    """Fresh or stale, and why, for every asset of `defs`."""
    database = db if db is not None and not isinstance(db, str) else open_db(db)
    latest = {name: catalog.latest(database, name) for name in defs.order}
    rows = []
    for name in defs.order:
        a, row = defs[name], latest[name]
        reasons = []
        if row is None:
            reasons.append("never materialized")
        else:
            if a.code_version != row.code_version:
                reasons.append(f"code version {row.code_version!r} -> {a.code_version!r}")
            used = catalog.upstream_versions(row)
            for dep in a.deps:
                newest = latest[dep]
                if newest is not None and used.get(dep) != newest.version:
                    reasons.append(f"upstream {dep} has a newer version")
        rows.append(AssetStatus(name, bool(reasons), tuple(reasons),
                                row.version if row else None,
                                row.created_at if row else None))
    return StatusTable(tuple(rows))


def stale_assets(defs, names: list[str], db) -> list[str]:
    """Of `names` (topological order), those stale now or downstream of one that is."""
    table = status(defs, db)
    out: list[str] = []
    for name in names:
        if table[name].stale or any(dep in out for dep in defs[name].deps):
            out.append(name)
    return out
