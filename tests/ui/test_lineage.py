"""The asset lineage's staleness: random histories of materializations (hypothesis), where
each version reads the upstream versions current when it was made, some failing checks.
The rule on rows agrees with a time-based statement of it (a target is stale when its
newest version failed a blocking check, or an upstream it read got a usable version after
it was made); the SQL read of the newest versions agrees with `assets.catalog.latest`."""

from __future__ import annotations

import itertools
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepx_flow.assets import catalog
from deepx_flow.meta import open_db
from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization
from deepx_flow.ui.asset_versions import newest_versions
from deepx_flow.ui.lineage import (BOX_W, FAILED, FRESH, NEVER, STALE, STATE_COLORS, Version,
                                   arrows, asset_states, figure, key_asset, picture,
                                   target_key)

PARTS = ("p0", "p1", "p2")


@st.composite
def histories(draw):
    """(upstream assets per asset, partitioned assets, the versions made, in time order)."""
    n = draw(st.integers(1, 6))
    names = [f"a{i}" for i in range(n)]
    deps = {a: sorted(draw(st.sets(st.sampled_from(names[:i]), max_size=3)) if i else [])
            for i, a in enumerate(names)}
    partitioned = {a for a in names if draw(st.booleans()) and draw(st.booleans())}
    made: list[Version] = []
    usable: dict[str, Version] = {}
    clock = itertools.count(1)
    for _ in range(draw(st.integers(0, 25))):
        a = draw(st.sampled_from(names))
        part = draw(st.sampled_from(PARTS)) if a in partitioned else None
        reads = {}
        for d in deps[a]:
            if d not in partitioned:
                reads[d] = [target_key(d, None)]
            elif part is not None:
                reads[d] = [target_key(d, part)]  # partition by partition
            else:
                reads[d] = [target_key(d, p) for p in PARTS]
        keys = [k for ks in reads.values() for k in ks]
        if any(k not in usable for k in keys):
            continue  # dx.materialize makes (or needs) what a target reads first
        passed = draw(st.sampled_from([None, True, True, False]))
        blocking = passed is False and draw(st.booleans())
        v = Version(a, part, uuid.uuid4().hex, {k: usable[k].version for k in keys},
                    float(next(clock)), passed, blocking)
        made.append(v)
        if not blocking:
            usable[target_key(a, part)] = v
    return deps, partitioned, made


def newest_of(made):
    """(newest version per target, newest usable per target), from the whole history."""
    newest, usable = {}, {}
    for v in made:  # in time order: later ones win
        newest[target_key(v.asset, v.partition)] = v
        if not v.blocked:
            usable[target_key(v.asset, v.partition)] = v
    return list(newest.values()), list(usable.values())


def stale_by_time(made, key: str) -> bool:
    """The rule said with times: the target's newest version failed a blocking check, or
    something its newest usable version read has a usable version made after it."""
    mine = [v for v in made if target_key(v.asset, v.partition) == key]
    if mine and mine[-1].blocked:
        return True
    good = [v for v in mine if not v.blocked]
    if not good:
        return False
    last = good[-1]
    return any(target_key(v.asset, v.partition) in last.upstream and not v.blocked
               and v.created_at > last.created_at for v in made)


RANDOM = settings(max_examples=300, deadline=None)


@RANDOM
@given(histories())
def test_the_rule_on_rows_is_the_rule_on_times(history):
    deps, partitioned, made = history
    states = asset_states(*newest_of(made))
    assert set(states) == {v.asset for v in made}
    for asset, s in states.items():
        keys = {target_key(v.asset, v.partition) for v in made if v.asset == asset}
        assert s.stale == any(stale_by_time(made, k) for k in keys)
        newest = {k: [v for v in made if target_key(v.asset, v.partition) == k][-1]
                  for k in keys}
        failed = any(v.checks_passed is False for v in newest.values())
        assert s.state == (FAILED if failed else STALE if s.stale else FRESH)
        assert bool(s.reasons) == s.stale
        # Edges: the assets its versions read, all among its declared upstreams.
        assert set(s.upstream) <= set(deps[asset])
        if asset in partitioned:
            usable = {k for k in keys if any(not v.blocked for v in made
                                              if target_key(v.asset, v.partition) == k)}
            assert s.partitions == len(usable) and s.version is None
        else:
            assert s.partitions is None


def test_a_reader_turns_stale_when_its_upstream_is_made_again():
    f1 = Version("features", None, "f1", {}, 1.0, True)
    mean = Version("feature_mean", None, "m1", {"features": "f1"}, 2.0, True)
    states = asset_states([f1, mean], [f1, mean])
    assert (states["features"].state, states["feature_mean"].state) == (FRESH, FRESH)
    f2 = Version("features", None, "f2", {}, 3.0, True)
    states = asset_states([f2, mean], [f2, mean])
    assert (states["features"].state, states["feature_mean"].state) == (FRESH, STALE)
    assert states["feature_mean"].reasons == ("upstream features has a newer version",)
    # A newer features that failed a blocking check is not used: mean stays fresh, and
    # features is stale (its newest failed) and drawn as failed.
    bad = Version("features", None, "f3", {}, 4.0, False, blocked=True)
    states = asset_states([bad, mean], [f1, mean])
    assert states["feature_mean"].state == FRESH
    assert (states["features"].state, states["features"].stale) == (FAILED, True)


def test_an_upstream_without_versions_is_never_materialized():
    daily = Version("daily", "2026-01-01", "d1", {"raw[2026-01-01]": "gone"}, 1.0)
    states = asset_states([daily], [daily])
    assert states["raw"].state == NEVER and states["raw"].stale
    assert states["daily"].state == FRESH  # nothing newer to compare with, as dx.status
    assert states["daily"].upstream == ("raw",) and states["daily"].partitions == 1


def test_the_picture_lays_out_every_asset_with_its_colour():
    a = Version("a", None, "a1", {}, 1.0)
    b = Version("b", None, "b1", {"a": "a0"}, 2.0)
    states = asset_states([a, b], [a, b])
    nodes, edges, note = picture(states)
    assert nodes["asset"] == ["a", "b"] and note == ""
    assert nodes["color"] == [STATE_COLORS[FRESH], STATE_COLORS[STALE]]
    assert nodes["x"][0] < nodes["x"][1]
    assert list(zip(edges["source"], edges["target"])) == [("a", "b")]


def test_edges_are_arrows_from_the_upstream_box_to_its_readers():
    a = Version("a", None, "a1", {}, 1.0)
    b = Version("b", None, "b1", {"a": "a1"}, 2.0)
    c = Version("c", None, "c1", {"a": "a1", "b": "b1"}, 3.0)
    nodes, edges, _ = picture(asset_states([a, b, c], [a, b, c]))
    at = dict(zip(nodes["asset"], zip(nodes["x"], nodes["y"])))
    drawn = arrows(edges)
    assert list(zip(drawn["source"], drawn["target"])) == [("a", "b"), ("a", "c"), ("b", "c")]
    for i, (up, reader) in enumerate(zip(drawn["source"], drawn["target"])):
        # From the right side of the upstream's box to the left side of the reader's.
        assert (drawn["x_start"][i], drawn["y_start"][i]) == (at[up][0] + BOX_W / 2, at[up][1])
        assert (drawn["x_end"][i], drawn["y_end"][i]) == (at[reader][0] - BOX_W / 2,
                                                          at[reader][1])
    fig = figure(nodes, edges)
    [arrow] = fig.select({"name": "lineage-arrows"})
    assert arrow.end is not None and arrow.start is None  # the head is at the reader
    assert arrow.source.name == "lineage-edges" and arrow.source.data == drawn


def test_a_cycle_in_the_rows_is_drawn_without_layers():
    a = Version("a", None, "a1", {"b": "b1"}, 1.0)
    b = Version("b", None, "b1", {"a": "a1"}, 2.0)
    nodes, edges, note = picture(asset_states([a, b], [a, b]))
    assert "cycle" in note and sorted(nodes["asset"]) == ["a", "b"]


def test_target_keys():
    assert target_key("daily", "2026-01-01") == "daily[2026-01-01]"
    assert key_asset("daily[2026-01-01]") == "daily" and key_asset("x") == "x"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(histories())
def test_the_sql_read_finds_what_catalog_latest_finds(tmp_path, history):
    _, _, made = history
    db = open_db(f"sqlite:///{tmp_path / uuid.uuid4().hex}.db")
    catalog.record_all(db, [(row(v), checks(v)) for v in made])
    newest, usable, more = newest_versions(db)
    assert not more
    want_newest, want_usable = newest_of(made)
    assert sorted(newest, key=str) == sorted(want_newest, key=str)
    assert sorted(usable, key=str) == sorted(want_usable, key=str)
    for v in want_newest:
        assert catalog.latest(db, v.asset, v.partition, usable=False).version == v.version
        good = catalog.latest(db, v.asset, v.partition)
        assert (good and good.version) == \
            next((u.version for u in want_usable if (u.asset, u.partition) ==
                  (v.asset, v.partition)), None)


def row(v: Version) -> AssetMaterialization:
    import json
    return AssetMaterialization(version=v.version, asset=v.asset, partition=v.partition,
                                upstream_versions=json.dumps(v.upstream), shape="[1]",
                                dtype="float32", storage="memory",
                                checks_passed=v.checks_passed, created_at=v.created_at)


def checks(v: Version) -> list[AssetCheckResult]:
    if v.checks_passed is None:
        return []
    return [AssetCheckResult(check="c", passed=bool(v.checks_passed), blocking=v.blocked,
                             created_at=v.created_at)]


def test_the_sql_read_on_every_backend(db):
    """Ties in time go to the higher id, as in catalog.latest; a blocked newest version
    leaves the one before it usable; partitions are targets of their own."""
    made = [Version("raw", "p0", "r0", {}, 1.0), Version("raw", "p1", "r1", {}, 1.0),
            Version("raw", "p0", "r2", {}, 2.0, False, blocked=True),
            Version("mean", None, "m0", {"raw[p0]": "r0", "raw[p1]": "r1"}, 3.0, True),
            Version("mean", None, "m1", {"raw[p0]": "r0", "raw[p1]": "r1"}, 3.0, True)]
    catalog.record_all(db, [(row(v), checks(v)) for v in made])
    newest, usable, more = newest_versions(db)
    assert sorted(v.version for v in newest) == ["m1", "r1", "r2"]
    assert sorted(v.version for v in usable) == ["m1", "r0", "r1"]
    states = asset_states(newest, usable)
    assert (states["raw"].state, states["raw"].partitions) == (FAILED, 2)
    assert states["mean"].state == FRESH and states["mean"].upstream == ("raw",)
    assert newest_versions(db, limit=2)[2]  # more targets than the limit
