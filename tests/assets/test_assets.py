"""Assets: definitions, selections, materialization into versioned Zarr storage, lineage,
staleness and `only_stale`, on a real local cluster and a fresh metadata database."""

from __future__ import annotations

import json

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.assets import catalog, select
from tests.helpers import assert_sums_close


def pipeline(features_version="1"):
    @dx.asset(code_version=features_version)
    def features():
        return dx.random.normal((3000, 64), seed=int(features_version), dtype="float64")

    @dx.asset
    def projection():
        return dx.random.uniform((64, 16), seed=7, dtype="float64") - 0.5

    @dx.asset(code_version="1")
    def embeddings(features, projection):
        return dx.tanh(features @ projection)

    @dx.asset(deps=["projection"])
    def summary(embeddings):
        return embeddings.mean(axis=0)

    return dx.Definitions(assets=[features, projection, embeddings, summary])


def test_selection_syntax():
    defs = pipeline()
    assert select(defs, "*") == ["features", "projection", "embeddings", "summary"]
    assert select(defs, "embeddings") == ["embeddings"]
    assert select(defs, "+embeddings") == ["features", "projection", "embeddings"]
    assert select(defs, "*summary") == defs.order
    assert select(defs, "+summary") == ["projection", "embeddings", "summary"]
    assert select(defs, "features+") == ["features", "embeddings"]
    assert select(defs, "features*") == ["features", "embeddings", "summary"]
    assert select(defs, "projection, summary") == ["projection", "summary"]
    with pytest.raises(dx.InputError, match="did you mean 'features'"):
        select(defs, "featurs")
    with pytest.raises(dx.InputError, match="cannot read"):
        select(defs, "+-x")


def test_definitions_are_checked():
    @dx.asset
    def a(b):
        return b

    @dx.asset
    def b(a):
        return a

    with pytest.raises(dx.GraphError, match="cycle: (a -> b -> a|b -> a -> b)"):
        dx.Definitions(assets=[a, b])

    @dx.asset
    def c(featurez):
        return featurez

    with pytest.raises(dx.GraphError, match="asset c depends on 'featurez'"):
        dx.Definitions(assets=[c])
    with pytest.raises(dx.GraphError, match="two assets are named 'c'"):
        dx.Definitions(assets=[c, c, *pipeline().assets.values()])


def test_materialize_stores_versions_and_lineage(client, env):
    defs = pipeline()
    done = dx.materialize(defs, client=client)
    assert list(done.versions) == defs.order

    f = dx.run(dx.load("features"), client=client)
    p = dx.run(dx.load("projection"), client=client)
    e = dx.run(dx.load("embeddings"), client=client)
    s = dx.run(dx.load("summary"), client=client)
    assert_sums_close(e, np.tanh(f @ p), np.abs(f) @ np.abs(p))  # tanh: |error| stays
    assert_sums_close(s, np.tanh(f @ p).mean(axis=0), np.abs(np.tanh(f @ p)).mean(axis=0))
    # The stored random tensor is the same one dx.random gives: values from (seed, index).
    np.testing.assert_array_equal(f, dx.run(dx.random.normal((3000, 64), seed=1,
                                                             dtype="float64"), client=client))

    rows = {name: catalog.latest(env, name) for name in defs.order}
    assert json.loads(rows["embeddings"].upstream_versions) == {
        "features": rows["features"].version, "projection": rows["projection"].version}
    assert json.loads(rows["summary"].upstream_versions) == {
        "embeddings": rows["embeddings"].version, "projection": rows["projection"].version}
    assert all(r.run_id == done.run_id for r in rows.values())  # one run for all four
    assert rows["embeddings"].nbytes == 3000 * 16 * 8
    assert str(dx.status(defs)).count("fresh") == 4


def test_staleness_and_only_stale(client, env):
    dx.materialize(pipeline(), client=client)
    before = {name: catalog.latest(env, name).version for name in pipeline().order}

    changed = pipeline(features_version="2")
    table = dx.status(changed)
    assert table["features"].stale and "code version '1' -> '2'" in table["features"].reasons[0]
    assert not table["embeddings"].stale  # nothing newer upstream yet

    dx.materialize(changed, "features", client=client)
    table = dx.status(changed)
    assert not table["features"].stale
    assert table["embeddings"].stale and \
        table["embeddings"].reasons == ("upstream features has a newer version",)
    assert not table["summary"].stale  # its own upstream (embeddings) is unchanged so far

    redone = dx.materialize(changed, only_stale=True, client=client)
    assert list(redone.versions) == ["embeddings", "summary"]  # summary: downstream of one
    assert catalog.latest(env, "projection").version == before["projection"]
    assert all(not r.stale for r in dx.status(changed).rows)
    f = dx.run(dx.load("features"), client=client)
    e = dx.run(dx.load("embeddings"), client=client)
    p = dx.run(dx.load("projection"), client=client)
    assert_sums_close(e, np.tanh(f @ p), np.abs(f) @ np.abs(p))
    # The first version is still there to load by id.
    old = dx.run(dx.load("embeddings", version=before["embeddings"]), client=client)
    assert not np.allclose(old, e)
    assert dx.materialize(changed, only_stale=True, client=client).versions == {}


def test_unmaterialized_upstream_is_a_clear_error(client, env):
    with pytest.raises(dx.InputError, match="reads features, which has never been "
                                            "materialized: materialize it first, or "
                                            "select it too"):
        dx.materialize(pipeline(), "embeddings", client=client)
    with pytest.raises(dx.InputError, match="asset 'features' has no stored version"):
        dx.load("features")


def test_a_failing_stage_leaves_nothing_behind(client, env, tmp_path):
    import zarr
    path = tmp_path / "corrupt.zarr"
    zarr.save_array(str(path), np.ones(1000), zarr_format=3)
    (path / "c" / "0").write_bytes(b"not zstd")  # its one chunk cannot be decoded

    @dx.asset
    def good():
        return dx.arange(1000, dtype="float64")

    @dx.asset
    def bad(good):
        return good + dx.read_zarr(str(path))

    with pytest.raises(dx.DataError, match=r"Zarr array .*corrupt.zarr: chunk \(0,\) is "
                                           r"damaged"):
        dx.materialize(dx.Definitions(assets=[good, bad]), client=client)
    # One stage: neither version was published, and nothing is left under the asset root.
    assert catalog.history(env, "good") == [] and catalog.history(env, "bad") == []
    root = tmp_path / "assets"
    assert not root.exists() or not any(p.is_file() for p in root.rglob("*"))


def test_materialize_records_its_runs_in_the_database_it_is_given(client, tmp_path,
                                                                     monkeypatch):
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    from deepx_flow.meta.queries import list_runs
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    other = f"sqlite:///{tmp_path / 'other.db'}"
    done = dx.materialize(pipeline(), "features", client=client, db=other)
    runs = list_runs(open_db(other), limit=10)
    assert [r.id for r in runs] == [done.run_id]
    assert catalog.latest(open_db(other), "features").run_id == done.run_id
    close_all()
