"""The asset catalogue in the metadata database: recording versions, finding the latest.

A version whose blocking check failed is recorded (to be looked at) but not used: `latest`
skips it unless asked, so downstream assets and `dx.load` keep the last good version.
"""

from __future__ import annotations

import json

from sqlalchemy import and_, exists
from sqlmodel import col, select

from deepx_flow.meta.db import Database
from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization

# A version with a failed blocking check.
_BLOCKED = exists().where(and_(
    AssetCheckResult.materialization_id == AssetMaterialization.id,
    col(AssetCheckResult.passed).is_(False), col(AssetCheckResult.blocking).is_(True)))


def _newest_first(query):
    return query.order_by(col(AssetMaterialization.created_at).desc(),
                          col(AssetMaterialization.id).desc())


def latest(db: Database, asset: str, partition: str | None = None,
           usable: bool = True) -> AssetMaterialization | None:
    """The newest version of `asset` (of one partition, if given); with `usable`, the
    newest whose blocking checks passed."""
    query = select(AssetMaterialization).where(AssetMaterialization.asset == asset)
    query = query.where(AssetMaterialization.partition == partition) if partition is not None \
        else query.where(col(AssetMaterialization.partition).is_(None))
    if usable:
        query = query.where(~_BLOCKED)
    with db.read() as session:
        return session.exec(_newest_first(query).limit(1)).first()


def latest_partitions(db: Database, asset: str,
                      usable: bool = True) -> dict[str, AssetMaterialization]:
    """Partition key -> the newest (usable) version of that partition of `asset`."""
    query = select(AssetMaterialization).where(
        AssetMaterialization.asset == asset, col(AssetMaterialization.partition).is_not(None))
    if usable:
        query = query.where(~_BLOCKED)
    out: dict[str, AssetMaterialization] = {}
    with db.read() as session:
        for row in session.exec(_newest_first(query)):
            out.setdefault(row.partition, row)
    return out


def history(db: Database, asset: str) -> list[AssetMaterialization]:
    """Every version of `asset`, newest first (also failed-check ones)."""
    with db.read() as session:
        return list(session.exec(_newest_first(
            select(AssetMaterialization).where(AssetMaterialization.asset == asset))))


def check_results(db: Database, materialization_id: int) -> list[AssetCheckResult]:
    with db.read() as session:
        return list(session.exec(select(AssetCheckResult).where(
            AssetCheckResult.materialization_id == materialization_id)
            .order_by(col(AssetCheckResult.id))))


def record_all(db: Database, versions: list[tuple[AssetMaterialization,
                                                 list[AssetCheckResult]]]) -> None:
    """Publish versions: their rows and check results in one transaction, written after
    their data, so readers never see a version whose data is incomplete, nor part of a
    materialization's versions."""
    with db.session() as session:
        for row, checks in versions:
            session.add(row)
            session.flush()  # the row's id, for its check results
            for check in checks:
                check.materialization_id = row.id
                session.add(check)


def bind_manifest(db: Database, row: AssetMaterialization, digest: str) -> str:
    """Record the manifest digest of a version stored before rows recorded one (`row`);
    return the digest the row holds after: `digest`, or the one another process recorded
    first (whose manifest is then the one in storage)."""
    from sqlalchemy import update
    with db.session() as session:
        session.exec(update(AssetMaterialization)
                     .where(AssetMaterialization.id == row.id,
                            col(AssetMaterialization.manifest_digest).is_(None))
                     .values(manifest_digest=digest))
        return session.get(AssetMaterialization, row.id).manifest_digest


def upstream_versions(row: AssetMaterialization) -> dict[str, str]:
    """Upstream asset (or "asset[partition]") -> the version this one read."""
    return json.loads(row.upstream_versions or "{}")
