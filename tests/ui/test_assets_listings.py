"""The assets page's listings over a small database: each page sorted in the database is
what sorting the expected rows in Python gives, the pages hold every row once, and the
catalogue's grouping (latest version, counts) is what the rows say; the upstream versions
are read from their JSON."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlmodel import select

from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization, GraphRecord, Run
from deepx_flow.ui.pages.assets import (CATALOGUE, CHECKS, PARTITIONS, VERSIONS,
                                        latest_version, upstream_rows)
from tests.ui.paging import matches

ASSETS = ("alpha", "beta", "gamma", "delta", "eps", "zeta", "eta")
PARTITIONED = ("gamma", "zeta")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    db = open_db(f"sqlite:///{tmp_path_factory.mktemp('ui-assets') / 'deepx.db'}")
    rng = random.Random(11)
    rows = []
    for asset in ASSETS:
        for _ in range(rng.randint(1, 7)):
            # Few distinct times, so the newest is often decided by the id.
            rows.append(AssetMaterialization(
                version=f"{rng.getrandbits(64):016x}", asset=asset,
                partition=rng.choice(["2026-01-01", "2026-01-02", "2026-01-03"])
                if asset in PARTITIONED else None,
                code_version=rng.choice([None, "1", "2"]), shape=f"[{rng.randint(1, 9)}]",
                dtype=rng.choice(["float32", "float64"]), storage=rng.choice(["zarr", "memory"]),
                nbytes=rng.choice([None, rng.randint(1, 10_000)]),
                seconds=rng.choice([None, rng.random()]),
                uri=rng.choice([None, f"file:///a/{rng.getrandbits(16)}"]),
                run_id=rng.choice([None, "r1"]), checks_passed=rng.choice([None, True, False]),
                upstream_versions=json.dumps({"alpha": "v1"}),
                created_at=1.7e9 + rng.randint(0, 3)))
    rng.shuffle(rows)  # ids in another order than the times
    with db.session() as s:
        s.add(GraphRecord(hash="g", n_nodes=1, created_at=0.0))
        s.add(Run(id="r1", graph_hash="g", started_at=1.7e9, scheduler="s", cluster="c",
                  n_workers=1, n_tasks=1, n_chunks=1, host="h", pid=1, username="u"))
        s.flush()
        s.add_all(rows)
        s.flush()
        s.add_all([AssetCheckResult(materialization_id=m.id, check=f"check{k}",
                                    passed=rng.random() < 0.7, blocking=rng.random() < 0.5,
                                    value=rng.choice([None, rng.random()]),
                                    message=rng.choice([None, "ok", "bad"]),
                                    created_at=m.created_at + rng.randint(0, 2))
                   for m in rows for k in range(rng.randint(0, 2))])
    with db.read() as s:
        materializations = list(s.exec(select(AssetMaterialization)))
        checks = list(s.exec(select(AssetCheckResult)))
    yield db, materializations, checks
    close_all()


def newest(rows):
    return max(rows, key=lambda m: (m.created_at, m.id))


def checks_text(passed):
    return {True: "passed", False: "failed", None: ""}[passed]


def catalogue_rows(materializations):
    out = []
    for asset in {m.asset for m in materializations}:
        mine = [m for m in materializations if m.asset == asset]
        latest = newest(mine)
        out.append({"asset": asset, "version": latest.version, "created": latest.created_at,
                    "versions": len(mine),
                    "partitions": len({m.partition for m in mine} - {None}),
                    "checks": checks_text(latest.checks_passed), "storage": latest.storage,
                    "shape": latest.shape, "dtype": latest.dtype})
    return out


def version_rows(materializations, asset):
    return [{"version": m.version, "partition": m.partition, "code_version": m.code_version,
             "created": m.created_at, "seconds": m.seconds, "bytes": m.nbytes,
             "run": m.run_id, "checks": checks_text(m.checks_passed), "uri": m.uri,
             "id": m.id} for m in materializations if m.asset == asset]


def check_rows(materializations, checks, asset):
    by_id = {m.id: m for m in materializations}
    yes = {True: "yes", False: "no"}
    return [{"check": c.check, "passed": yes[c.passed], "blocking": yes[c.blocking],
             "value": c.value, "message": c.message,
             "version": by_id[c.materialization_id].version,
             "partition": by_id[c.materialization_id].partition, "created": c.created_at,
             "id": c.id} for c in checks if by_id[c.materialization_id].asset == asset]


def partition_rows(materializations, asset):
    mine = [m for m in materializations if m.asset == asset and m.partition is not None]
    out = []
    for key in {m.partition for m in mine}:
        latest = newest([m for m in mine if m.partition == key])
        out.append({"partition": key, "version": latest.version,
                    "created": latest.created_at, "checks": checks_text(latest.checks_passed)})
    return out


@settings(max_examples=30, deadline=None)
@given(sort=st.sampled_from(list(CATALOGUE.columns)), descending=st.booleans(),
       size=st.integers(1, 8))
def test_the_catalogue_has_one_row_per_asset_with_its_latest_version(seeded, sort, descending,
                                                                     size):
    db, materializations, _ = seeded
    want = catalogue_rows(materializations)
    assert len(want) == len(ASSETS)
    matches(CATALOGUE, db, want, sort, descending, size, "asset")


@settings(max_examples=30, deadline=None)
@given(asset=st.sampled_from(ASSETS), sort=st.sampled_from(list(VERSIONS.columns)),
       descending=st.booleans(), size=st.integers(1, 5))
def test_an_assets_versions_page_and_sort_in_the_database(seeded, asset, sort, descending,
                                                          size):
    db, materializations, _ = seeded
    want = version_rows(materializations, asset)
    matches(VERSIONS, db, want, sort, descending, size, "id", asset=asset)


@settings(max_examples=30, deadline=None)
@given(asset=st.sampled_from(ASSETS), sort=st.sampled_from(list(CHECKS.columns)),
       descending=st.booleans(), size=st.integers(1, 5))
def test_an_assets_check_results_page_and_sort_in_the_database(seeded, asset, sort,
                                                               descending, size):
    db, materializations, checks = seeded
    want = check_rows(materializations, checks, asset)
    matches(CHECKS, db, want, sort, descending, size, "id", asset=asset)


@settings(max_examples=20, deadline=None)
@given(asset=st.sampled_from(ASSETS), sort=st.sampled_from(list(PARTITIONS.columns)),
       descending=st.booleans(), size=st.integers(1, 3))
def test_an_assets_partitions_show_each_partitions_latest_version(seeded, asset, sort,
                                                                  descending, size):
    db, materializations, _ = seeded
    want = partition_rows(materializations, asset)
    assert bool(want) == (asset in PARTITIONED)
    matches(PARTITIONS, db, want, sort, descending, size, "partition", asset=asset)


def test_the_latest_version_is_the_newest_row(seeded):
    db, materializations, _ = seeded
    for asset in ASSETS:
        assert latest_version(db, asset).id == newest(
            [m for m in materializations if m.asset == asset]).id
    assert latest_version(db, "no_such_asset") is None


keys = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)


@given(plain=st.dictionaries(keys.filter(lambda k: "[" not in k), keys, max_size=5),
       parted=st.dictionaries(st.tuples(keys.filter(lambda k: "[" not in k),
                                        keys.filter(lambda k: "]" not in k)), keys,
                              max_size=5))
def test_upstream_rows_read_asset_and_partition_from_each_key(plain, parted):
    used = {**plain, **{f"{a}[{p}]": v for (a, p), v in parted.items()}}
    rows = upstream_rows(json.dumps(used))
    assert [f"{a}[{p}]" if p else a for a, p, _ in rows] == sorted(used)
    assert all(used[f"{a}[{p}]" if p else a] == v for a, p, v in rows)
    assert upstream_rows(None) == [] and upstream_rows("{}") == []
