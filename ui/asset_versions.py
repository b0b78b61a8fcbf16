"""The newest versions of every asset target, read in SQL for the lineage picture.

A target is an asset, or one partition of it. Per target the lineage needs its newest
version and its newest usable one (no failed blocking check), as `assets.catalog.latest`
finds them one target at a time. Here one grouped query finds every target's newest row,
so only those leave the database; usable versions are looked up again only for the few
targets whose newest one is blocked.
"""

from __future__ import annotations

import json

from sqlalchemy import and_, exists, func, true
from sqlmodel import col, select

from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization as AM
from deepx_flow.ui.lineage import Version

MAX_TARGETS = 20_000  # beyond this the lineage is drawn from the first targets by name

_BLOCKED = exists().where(and_(AssetCheckResult.materialization_id == AM.id,
                               col(AssetCheckResult.passed).is_(False),
                               col(AssetCheckResult.blocking).is_(True)))


def _top_per_target(where=None, limit: int = MAX_TARGETS):
    """The newest rows of the first `limit` targets (by asset and partition) among rows
    matching `where`: each target's latest time found by GROUP BY, its rows at that time
    joined back (the index on asset and time finds them); of rows made at the same time,
    the one with the highest id comes first, as `catalog.latest` orders them."""
    top = select(AM.asset.label("asset"), AM.partition.label("partition"),
                 func.max(AM.created_at).label("at"))
    if where is not None:
        top = top.where(where)
    top = (top.group_by(AM.asset, AM.partition).order_by(AM.asset, AM.partition)
           .limit(limit).subquery())
    return (select(AM.id, AM.asset, AM.partition, AM.version, AM.upstream_versions,
                   AM.created_at, AM.checks_passed, _BLOCKED.label("blocked"))
            .join(top, and_(AM.asset == top.c.asset, AM.created_at == top.c.at,
                            col(AM.partition).is_not_distinct_from(top.c.partition)))
            .where(where if where is not None else true())
            .order_by(col(AM.asset), col(AM.partition), col(AM.id).desc()))


def _first_per_target(rows) -> list:
    out, seen = [], set()
    for r in rows:
        if (r.asset, r.partition) not in seen:
            seen.add((r.asset, r.partition))
            out.append(r)
    return out


def _version(row) -> Version:
    try:
        upstream = json.loads(row.upstream_versions or "{}")
    except ValueError:
        upstream = {}
    if not isinstance(upstream, dict):
        upstream = {}
    return Version(row.asset, row.partition, row.version,
                   {str(k): str(v) for k, v in upstream.items()}, row.created_at,
                   row.checks_passed, bool(row.blocked))


def newest_versions(db, limit: int = MAX_TARGETS) -> tuple[list[Version], list[Version], bool]:
    """(the newest version of each target, the newest usable one of each target that has
    one, whether there were more than `limit` targets)."""
    with db.read() as session:
        conn = session.connection()
        rows = _first_per_target(conn.execute(_top_per_target(limit=limit + 1)))
        more = len(rows) > limit
        newest = [_version(r) for r in rows[:limit]]
        blocked = sorted({v.asset for v in newest if v.blocked})
        usable = [v for v in newest if not v.blocked]
        if blocked:
            keys = {(v.asset, v.partition) for v in newest if v.blocked}
            again = _first_per_target(conn.execute(_top_per_target(
                and_(col(AM.asset).in_(blocked), ~_BLOCKED), limit=len(newest))))
            usable += [_version(r) for r in again if (r.asset, r.partition) in keys]
    return newest, usable, more
