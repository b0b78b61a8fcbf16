"""Asset checks: values computed on the cluster agree with NumPy in float64; a failing
blocking check stops downstream assets and keeps the last good version in use."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.assets import catalog

N = 20_000


def spiky(bad_every: int | None, seed: int):
    """A (N,) float64 tensor of normals with NaN and inf at known places (none if None)."""
    x = dx.random.normal((N,), seed=seed, dtype="float64")
    if bad_every is None:
        return x
    i = dx.arange(N, dtype="float64")
    nan = dx.full((N,), np.nan, dtype="float64")
    inf = dx.full((N,), np.inf, dtype="float64")
    # every bad_every-th index NaN, the one after it +inf
    k = i - dx.cast(dx.cast(i / bad_every, "int64"), "float64") * bad_every
    return dx.where(k == 0, nan, dx.where(k == 1, inf, x))


def spiky_np(bad_every: int | None, seed: int, client) -> np.ndarray:
    x = dx.run(dx.random.normal((N,), seed=seed, dtype="float64"), client=client)
    if bad_every is not None:
        x = x.copy()
        x[::bad_every] = np.nan
        x[1::bad_every] = np.inf
    return x


def pipeline(bad_every=None, seed=0, checks=(dx.checks.all_finite,), version="1"):
    @dx.asset(code_version=version, checks=list(checks))
    def raw():
        return spiky(bad_every, seed)

    @dx.asset
    def doubled(raw):
        return raw * 2.0

    @dx.asset
    def total(doubled):
        return doubled.sum()

    return dx.Definitions(assets=[raw, doubled, total])


def test_a_failing_blocking_check_stops_downstream_and_keeps_the_good_version(client, env):
    good = dx.materialize(pipeline(), client=client)
    assert list(good.versions) == ["raw", "doubled", "total"]
    assert [(c.check, c.passed, c.value) for c in good.checks["raw"]] == \
        [("all_finite", True, 0.0)]
    # raw has a blocking check, so what reads it ran after it: two runs
    assert len(good.run_ids) == 2

    with pytest.raises(dx.CheckFailed, match="asset raw: blocking check all_finite failed: "
                                             r"2000 of 20000 values are not finite.*"
                                             "not materialized: doubled, total") as caught:
        dx.materialize(pipeline(bad_every=20, version="2"), client=client)
    done = caught.value.materialized
    assert list(done.versions) == ["raw"] and set(done.skipped) == {"doubled", "total"}
    assert "blocking check all_finite of raw failed" in done.skipped["doubled"]
    assert "upstream doubled was not materialized" in done.skipped["total"]

    # The failed version is recorded with its check result ...
    bad_row = done.versions["raw"]
    assert bad_row.checks_passed is False
    [result] = catalog.check_results(env, bad_row.id)
    assert (result.passed, result.blocking, result.value) == (False, True, 2000.0)
    assert catalog.history(env, "raw")[0].version == bad_row.version
    # ... but not used: dx.load and downstream assets keep the good version.
    assert catalog.latest(env, "raw").version == good.versions["raw"].version
    np.testing.assert_array_equal(dx.run(dx.load("raw"), client=client),
                                  spiky_np(None, 0, client))
    np.testing.assert_array_equal(dx.run(dx.load("raw", version=bad_row.version[:8]),
                                         client=client), spiky_np(20, 0, client))
    assert catalog.latest(env, "doubled").version == good.versions["doubled"].version
    table = dx.status(pipeline(bad_every=20, version="2"))
    assert table["raw"].stale and any("failed a blocking check" in r
                                      for r in table["raw"].reasons)

    # Fixed: the next materialization goes through, downstream reads the new version.
    fixed = dx.materialize(pipeline(seed=3, version="3"), only_stale=True, client=client)
    assert list(fixed.versions) == ["raw", "doubled", "total"]
    assert dx.run(dx.load("total"), client=client) == pytest.approx(
        (spiky_np(None, 3, client) * 2).sum(), rel=1e-12)


def test_a_non_blocking_failure_warns_and_downstream_runs(client, env):
    defs = pipeline(bad_every=7, checks=[dx.checks.all_finite.non_blocking()])
    with pytest.warns(UserWarning, match="asset raw: check all_finite failed"):
        done = dx.materialize(defs, client=client)
    assert list(done.versions) == ["raw", "doubled", "total"] and not done.skipped
    assert len(done.run_ids) == 1  # no blocking check: one graph
    assert catalog.latest(env, "raw").version == done.versions["raw"].version
    assert np.isnan(dx.run(dx.load("total"), client=client))


def test_range_shape_and_custom_reduction_values_match_numpy(client, env):
    x = spiky_np(None, 5, client)
    checks = [dx.checks.in_range(-3.0, 3.0), dx.checks.in_range(low=-10.0, name="above"),
              dx.checks.shape((N,)), dx.checks.shape((None, 2), name="matrix"),
              dx.checks.reduction(lambda t: (t * t).mean(), lambda v: abs(v - 1) < 0.05,
                                  name="unit_variance"),
              dx.checks.reduction(lambda t: t.max(), lambda v: v < 0, name="all_negative",
                                  blocking=False)]
    defs = pipeline(seed=5, checks=[c.non_blocking() for c in checks])
    with pytest.warns(UserWarning):
        done = dx.materialize(defs, "raw", client=client)
    results = {c.check: c for c in done.checks["raw"]}
    out_of_range = results["in_range"]
    assert not out_of_range.passed and out_of_range.value in (pytest.approx(x.min()),
                                                              pytest.approx(x.max()))
    assert f"[{x.min():.6g}, {x.max():.6g}]" in out_of_range.message
    assert results["above"].passed
    assert results["shape"].passed and not results["matrix"].passed
    assert "expected (None, 2)" in results["matrix"].message
    assert results["unit_variance"].passed
    assert results["unit_variance"].value == pytest.approx((x * x).mean(), rel=1e-12)
    assert not results["all_negative"].passed
    assert results["all_negative"].value == pytest.approx(x.max(), rel=1e-15)
    # Stored with the version, in order.
    stored = catalog.check_results(env, done.versions["raw"].id)
    assert [(r.check, r.passed) for r in stored] == \
        [(c.check, c.passed) for c in done.checks["raw"]]


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad_every=st.sampled_from([None, 2, 3, 97, 5000, 20_000]), seed=st.integers(0, 50))
def test_all_finite_counts_what_numpy_counts(client, env, bad_every, seed):
    defs = pipeline(bad_every, seed, checks=[dx.checks.all_finite.non_blocking()])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        done = dx.materialize(defs, "raw", client=client)
    [result] = done.checks["raw"]
    expected = int((~np.isfinite(spiky_np(bad_every, seed, client))).sum())
    assert (result.value, result.passed) == (expected, expected == 0)
    warned = [w for w in seen if "check all_finite failed" in str(w.message)]
    assert len(warned) == (1 if expected else 0)


def test_a_raising_predicate_fails_the_check_with_its_error(client, env):
    def boom(value):
        raise ValueError("no good")
    defs = pipeline(checks=[dx.checks.reduction(lambda t: t.sum(), boom, name="boom")])
    with pytest.raises(dx.CheckFailed, match="the check raised ValueError: no good"):
        dx.materialize(defs, client=client)


def test_bad_checks_are_named():
    with pytest.raises(dx.GraphError, match="asset a: checks take dx.checks objects"):
        @dx.asset(checks=[lambda t: t])
        def a():
            return dx.ones((2,))
    with pytest.raises(dx.GraphError, match="two checks are named 'all_finite'"):
        @dx.asset(checks=[dx.checks.all_finite, dx.checks.all_finite])
        def b():
            return dx.ones((2,))
    with pytest.raises(dx.GraphError, match="reduction of a lambda needs name"):
        dx.checks.reduction(lambda t: t.sum(), bool)
    with pytest.raises(dx.GraphError, match="needs a low or a high bound"):
        dx.checks.in_range()


def test_empty_assets_and_non_scalar_reductions(client, env):
    @dx.asset(checks=[dx.checks.in_range(0, 1), dx.checks.all_finite])
    def empty():
        return dx.zeros((0, 4), dtype="float64")

    done = dx.materialize(dx.Definitions(assets=[empty]), client=client)
    assert [(c.check, c.passed) for c in done.checks["empty"]] == \
        [("in_range", True), ("all_finite", True)]

    @dx.asset(checks=[dx.checks.reduction(lambda t: t.mean(axis=0), lambda v: True,
                                          name="col_means")])
    def wide():
        return dx.ones((3, 4))

    with pytest.raises(dx.GraphError, match="asset wide: check col_means: must build a "
                                            r"scalar .* got shape \(4,\)"):
        dx.materialize(dx.Definitions(assets=[wide]), client=client)
