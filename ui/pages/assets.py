"""The assets page: the catalogue (one row per asset, its latest version and how many it
has), and one asset's page (`assets?asset=<name>`): its versions, its check results, its
partitions and the upstream versions its latest version read.

Everything is read a page at a time: the catalogue and the per-partition view group the
materializations in SQL, and "latest" is the newest row by (created, id), as
`deepx_flow.assets.catalog` orders versions (failed-check versions included: the page shows
what was recorded, not only what `dx.load` would use).
"""

from __future__ import annotations

import json

import panel as pn
from sqlalchemy import case, func
from sqlmodel import col, select

from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization
from deepx_flow.ui.data import Listing, Rows
from deepx_flow.ui.session import session_arg
from deepx_flow.ui.table import PagedTable, size_text, text_table, utc_text
from deepx_flow.ui.text import Text

M, C = AssetMaterialization, AssetCheckResult


def _newest_first():
    return (col(M.created_at).desc(), col(M.id).desc())


def _text_of(flag) -> object:
    """A nullable boolean column as words, so the table says what it means."""
    return case((flag.is_(True), "passed"), (flag.is_(False), "failed"), else_="")


def _yes_no(flag) -> object:
    return case((flag.is_(True), "yes"), else_="no")


def _ranked(keys: tuple, where: tuple = ()):
    """Each materialization's id and its rank within its group of `keys`, newest first:
    rank 1 is the group's latest version."""
    return select(M.id, func.row_number().over(partition_by=keys, order_by=_newest_first())
                  .label("rank")).where(*where).subquery()


# --- the catalogue: one row per asset ---------------------------------------------------

_RANKED = _ranked((M.asset,))
_COUNTS = select(M.asset, func.count().label("versions"),
                 func.count(col(M.partition).distinct()).label("partitions")) \
    .group_by(M.asset).subquery()


def _catalogue():
    return select(M).join(_RANKED, _RANKED.c.id == M.id) \
        .join(_COUNTS, _COUNTS.c.asset == M.asset).where(_RANKED.c.rank == 1)


CATALOGUE = Listing(
    columns={"asset": col(M.asset), "version": col(M.version), "created": col(M.created_at),
             "versions": _COUNTS.c.versions, "partitions": _COUNTS.c.partitions,
             "checks": _text_of(col(M.checks_passed)), "storage": col(M.storage),
             "shape": col(M.shape), "dtype": col(M.dtype)},
    default_sort="asset", descending=False, source=_catalogue, tie=col(M.asset))


# --- one asset --------------------------------------------------------------------------

def _versions(asset: str):
    return select(M).where(M.asset == asset)


VERSIONS = Listing(
    columns={"version": col(M.version), "partition": col(M.partition),
             "code_version": col(M.code_version), "created": col(M.created_at),
             "seconds": col(M.seconds), "bytes": col(M.nbytes), "run": col(M.run_id),
             "checks": _text_of(col(M.checks_passed)), "uri": col(M.uri)},
    default_sort="created", descending=True, source=_versions, tie=col(M.id))


def _checks(asset: str):
    return select(C).join(M, M.id == C.materialization_id).where(M.asset == asset)


CHECKS = Listing(
    columns={"check": col(C.check), "passed": _yes_no(col(C.passed)),
             "blocking": _yes_no(col(C.blocking)), "value": col(C.value),
             "message": col(C.message), "version": col(M.version),
             "partition": col(M.partition), "created": col(C.created_at)},
    default_sort="created", descending=True, source=_checks, tie=col(C.id))


def _partitions(asset: str):
    where = (M.asset == asset, col(M.partition).is_not(None))
    ranked = _ranked((M.asset, M.partition), where)
    return select(M).join(ranked, ranked.c.id == M.id).where(ranked.c.rank == 1, *where)


PARTITIONS = Listing(
    columns={"partition": col(M.partition), "version": col(M.version),
             "created": col(M.created_at), "checks": _text_of(col(M.checks_passed))},
    default_sort="partition", descending=False, source=_partitions, tie=col(M.partition))


def latest_version(db, asset: str) -> AssetMaterialization | None:
    """The newest recorded version of `asset` (any partition), or None for no such asset."""
    with db.read() as session:
        return session.exec(select(M).where(M.asset == asset).order_by(*_newest_first())
                            .limit(1)).first()


def upstream_rows(upstream_json: str | None) -> list[tuple[str, str, str]]:
    """(asset, partition, version) for each upstream version a materialization read, from
    its `upstream_versions` JSON ("asset" or "asset[partition]" -> version), by key."""
    rows = []
    for key, version in sorted(json.loads(upstream_json or "{}").items()):
        asset, bracket, partition = key.partition("[")
        if bracket and partition.endswith("]"):
            rows.append((asset, partition[:-1], str(version)))
        else:
            rows.append((key, "", str(version)))
    return rows


# --- the pages --------------------------------------------------------------------------

def assets_page(db, scheduler=None):
    asset = session_arg("asset")
    if asset:
        return asset_detail(db, asset)
    table = PagedTable(CATALOGUE, db, links={"asset": "assets?asset="},
                       css_class="deepx-assets")
    return pn.Column(pn.pane.Markdown("## Assets"), table, sizing_mode="stretch_width")


def asset_detail(db, asset: str):
    back = pn.pane.Markdown("[All assets](assets)")
    latest = latest_version(db, asset)
    if latest is None:
        return pn.Column(pn.pane.Markdown("## Asset"), back,
                         Text(f"no asset {asset!r} in the catalogue"),
                         sizing_mode="stretch_width")
    versions = PagedTable(VERSIONS, db, page_size=20, links={"run": "run?id="},
                          css_class="deepx-asset-versions", asset=asset)
    checks = PagedTable(CHECKS, db, page_size=20, css_class="deepx-asset-checks", asset=asset)
    parts = [pn.pane.Markdown("## Asset"), Text(asset, css_classes=["deepx-asset-name"]),
             back, _facts(latest, versions.total),
             pn.pane.Markdown("### Versions"), versions,
             pn.pane.Markdown("### Check results"), checks]
    partitions = PagedTable(PARTITIONS, db, page_size=20, css_class="deepx-asset-partitions",
                            asset=asset)
    if partitions.total:
        parts += [pn.pane.Markdown("### Partitions"), partitions]
    upstream = upstream_rows(latest.upstream_versions)
    parts += [pn.pane.Markdown("### Upstream versions the latest version read"),
              _upstream_table(upstream) if upstream else Text("none (a source asset)")]
    return pn.Column(*parts, sizing_mode="stretch_width")


def _facts(latest: AssetMaterialization, n_versions: int):
    facts = [("latest version", latest.version), ("partition", latest.partition or "-"),
             ("created", f"{utc_text(latest.created_at)} UTC"),
             ("code version", latest.code_version or "-"), ("shape", latest.shape),
             ("dtype", latest.dtype), ("chunks", latest.chunks or "-"),
             ("bytes", size_text(latest.nbytes)),
             ("storage", latest.storage), ("uri", latest.uri or "-"),
             ("run", latest.run_id or "-"), ("versions", f"{n_versions:,}")]
    table = text_table(["what", "value"], "deepx-asset-facts")
    table.show([(k, str(v)) for k, v in facts])
    return table


def _upstream_table(rows):
    # A materialization reads a bounded set of versions (its inputs), held in memory and
    # shown a page at a time; the asset names link to their own page.
    columns = ("asset", "partition", "version")
    return PagedTable(Rows(columns, [dict(zip(columns, r)) for r in rows], "asset"),
                      page_size=20, links={"asset": "assets?asset="},
                      css_class="deepx-asset-upstream")
