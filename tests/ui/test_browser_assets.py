"""The assets page in a real browser, over the seeded database (tests/ui/conftest.py): the
catalogue has one row per asset, an asset's page shows its versions, its check results, its
partitions and the upstream versions it read, all as the database holds them; no
JavaScript error and no request off the server."""

from __future__ import annotations

import json

import pytest
from sqlmodel import col, select

from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization as M
from tests.ui.browser import page_text, visit

pytestmark = pytest.mark.slow


def versions_of(db, asset):
    with db.read() as s:
        return list(s.exec(select(M).where(M.asset == asset)
                           .order_by(col(M.created_at).desc(), col(M.id).desc())))


def checks_of(db, asset):
    with db.read() as s:
        return list(s.exec(select(AssetCheckResult).join(
            M, M.id == AssetCheckResult.materialization_id).where(M.asset == asset)))


def rows(page, css):
    page.wait_for_selector(f".{css} .deepx-grid-row")
    return page.locator(f".{css} .deepx-grid-row")


def test_the_catalogue_has_one_row_per_asset(seeded, dashboard, browser):
    with seeded.db.read() as s:
        assets = sorted(s.exec(select(M.asset).distinct()))
    assert assets == ["daily", "feature_mean", "features"]
    page, problems = visit(browser, dashboard, "assets", "assets")
    shown = rows(page, "deepx-assets")
    assert shown.count() == len(assets)
    for asset, row in zip(assets, shown.all_inner_texts()):  # sorted by name
        versions = versions_of(seeded.db, asset)
        cells = row.split("\t") if "\t" in row else row.split("\n")
        assert cells[0] == asset and versions[0].version in row  # the latest version
        assert cells[3] == str(len(versions))
        assert cells[4] == str(len({v.partition for v in versions} - {None}))
    assert problems == []


def test_an_asset_shows_its_versions_and_check_results(seeded, dashboard, browser):
    versions = versions_of(seeded.db, "feature_mean")
    checks = checks_of(seeded.db, "feature_mean")
    assert len(versions) == 2 and len(checks) == 2  # materialized, then the schedule's tick
    page, problems = visit(browser, dashboard, "assets?asset=feature_mean", "asset")
    shown = rows(page, "deepx-asset-versions")
    assert shown.count() == 2
    texts = shown.all_inner_texts()
    assert all(v.version in t and v.run_id in t for v, t in zip(versions, texts))  # newest first
    shown = rows(page, "deepx-asset-checks")
    assert shown.count() == len(checks)
    assert all(c.check in t and ("yes" if c.passed else "no") in t
               for c, t in zip(sorted(checks, key=lambda c: (-c.created_at, c.id)),
                               shown.all_inner_texts()))
    # The upstream versions the latest read: the features version, by name and version.
    used = json.loads(versions[0].upstream_versions)
    assert list(used) == ["features"]
    upstream = rows(page, "deepx-asset-upstream").all_inner_texts()
    assert len(upstream) == 1 and "features" in upstream[0] and used["features"] in upstream[0]
    text = page_text(page)
    assert "feature_mean" in text and "Check results" in text
    assert "Partitions" not in text  # not a partitioned asset
    assert problems == []


def test_a_partitioned_asset_shows_its_partitions(seeded, dashboard, browser):
    versions = versions_of(seeded.db, "daily")
    partitions = sorted({v.partition for v in versions})
    assert partitions == ["2026-01-01", "2026-01-02"]  # DailyPartitions: the end is excluded
    page, problems = visit(browser, dashboard, "assets?asset=daily", "asset-partitions")
    shown = rows(page, "deepx-asset-partitions").all_inner_texts()
    assert len(shown) == len(partitions)
    newest = {}
    for v in reversed(versions):  # oldest first, so the newest of each partition stays
        newest[v.partition] = v.version
    assert all(p in t and newest[p] in t for p, t in zip(partitions, shown))
    assert rows(page, "deepx-asset-versions").count() == len(versions)
    assert problems == []


def test_the_catalogue_links_to_an_assets_page(seeded, dashboard, browser):
    page, problems = visit(browser, dashboard, "assets", "assets-link")
    rows(page, "deepx-assets")
    page.locator(".deepx-assets a:text-is('feature_mean')").click()
    page.wait_for_url("**/assets?asset=feature_mean")
    page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0 && "
                           "Bokeh.documents[0].is_idle", timeout=30_000)
    assert rows(page, "deepx-asset-versions").count() == len(versions_of(seeded.db,
                                                                          "feature_mean"))
    assert problems == []


def test_an_unknown_asset_says_so(dashboard, browser):
    page, problems = visit(browser, dashboard, "assets?asset=nosuchasset", "asset-unknown")
    assert "no asset 'nosuchasset' in the catalogue" in page_text(page)
    assert problems == []
