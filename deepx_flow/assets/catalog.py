"""The asset catalogue in the metadata database: recording versions, finding the latest."""

from __future__ import annotations

import json

from sqlmodel import col, select

from deepx_flow.meta.db import Database
from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization


def latest(db: Database, asset: str, partition: str | None = None) -> AssetMaterialization | None:
    """The newest stored version of `asset` (of one partition, if given)."""
    query = (select(AssetMaterialization).where(AssetMaterialization.asset == asset)
             .order_by(col(AssetMaterialization.created_at).desc(),
                       col(AssetMaterialization.id).desc()).limit(1))
    query = query.where(AssetMaterialization.partition == partition) if partition is not None \
        else query.where(col(AssetMaterialization.partition).is_(None))
    with db.read() as session:
        return session.exec(query).first()


def history(db: Database, asset: str) -> list[AssetMaterialization]:
    with db.read() as session:
        return list(session.exec(
            select(AssetMaterialization).where(AssetMaterialization.asset == asset)
            .order_by(col(AssetMaterialization.created_at).desc())))


def record(db: Database, row: AssetMaterialization, checks: list[AssetCheckResult]) -> None:
    """Publish a version: its row (and check results) in one transaction, written after its
    data, so readers never see a version whose data is incomplete."""
    with db.session() as session:
        session.add(row)
        session.flush()  # the row's id, for its check results
        for check in checks:
            check.materialization_id = row.id
            session.add(check)


def upstream_versions(row: AssetMaterialization) -> dict[str, str]:
    return json.loads(row.upstream_versions or "{}")
