"""The contract's asset calls (`deepx_flow/gateway/asset_calls.py`), without a transport:
assets defined by graph specs are materialized, versioned, checked and read as Python's
assets are, their values NumPy's; bad definitions are refused with nothing recorded; a
materialization is an operation that can be cancelled, leaving no version."""

import asyncio

import numpy as np
import pytest
from sqlmodel import select

from deepx_flow.errors import DeepxError, InputError, SpecError
from deepx_flow.gateway.errors import NotFound
from deepx_flow.gateway.service import Gateway
from deepx_flow.kernels.faults import Fault
from deepx_flow.meta.models import AssetDefinition, AssetMaterialization, Run
from tests.helpers import faults_on


def source(step=0.5, shape=(12, 4)):
    """A spec whose one output is arange(...) * step, made on the cluster."""
    return {"deepx": 1, "nodes": [{"id": "n", "op": "arange", "shape": [int(np.prod(shape))],
                                   "dtype": "float64", "attrs": {"start": 0.0, "step": step}},
                                  {"id": "a", "op": "reshape", "args": ["n"],
                                   "shape": list(shape)}],
            "outputs": ["a"]}


def reader(upstream="raw", shape=(12, 4), factor=2.0):
    return {"deepx": 1, "inputs": {upstream: {"shape": list(shape), "dtype": "float64"}},
            "nodes": [{"id": "y", "op": "mul", "args": [upstream, factor]},
                      {"id": "s", "op": "sum", "args": ["y"], "attrs": {"axes": [1]}}],
            "outputs": ["s"]}


def expected_raw(step=0.5, shape=(12, 4)):
    return (np.arange(np.prod(shape), dtype=np.float64) * step).reshape(shape)


@pytest.fixture
def gateway(client, db, tmp_path):
    return Gateway(client, db, tmp_path / "results")


def materialized(gateway, name, **kw):
    answer = asyncio.run(gateway.materialize(name, wait_seconds=120, **kw))
    assert answer["state"] in ("succeeded", "failed", "interrupted"), answer
    return answer


def test_defined_assets_materialize_version_and_read_as_numpy(gateway, db):
    gateway.assets.define("raw", source(), description="numbers")
    answer = gateway.assets.define("doubled", reader())
    assert answer["dependencies"] == ["raw"] and answer["status"] == "never materialized"
    listed = {a["name"]: a for a in gateway.assets.assets()["assets"]}
    assert list(listed) == ["raw", "doubled"] and listed["raw"]["description"] == "numbers"

    made = materialized(gateway, "raw")
    assert made["state"] == "succeeded" and made["kind"] == "materialize"
    raw_version = made["materialized"]["versions"]["raw"]
    made = materialized(gateway, "doubled")
    doubled_version = made["materialized"]["versions"]["doubled"]

    want = (expected_raw() * 2.0).sum(axis=1)
    np.testing.assert_allclose(gateway.assets.read("doubled"), want, rtol=1e-12)
    np.testing.assert_array_equal(gateway.assets.read("raw", ranges=[[3, 5], [1, 3]]),
                                  expected_raw()[3:5, 1:3])
    [version] = gateway.assets.versions("doubled")["versions"]
    assert version["version"] == doubled_version and version["lineage"] == {"raw": raw_version}
    assert version["datatype"] == "FP64" and version["shape"] == [12]
    with db.read() as s:
        assert s.get(Run, version["run_id"]).status == "succeeded"
    listed = {a["name"]: a for a in gateway.assets.assets()["assets"]}
    assert listed["doubled"]["status"] == "fresh"
    assert listed["doubled"]["latest_version"] == doubled_version

    # fresh: nothing to do, unless forced
    assert materialized(gateway, "doubled")["materialized"]["versions"] == {}
    again = materialized(gateway, "doubled", force=True)["materialized"]["versions"]
    assert set(again) == {"doubled"} and again["doubled"] != doubled_version


def test_defining_again_changes_the_code_version_only_when_the_definition_changes(gateway):
    first = gateway.assets.define("raw", source())
    assert gateway.assets.define("raw", source())["code_version"] == first["code_version"]
    materialized(gateway, "raw")
    changed = gateway.assets.define("raw", source(step=0.25))
    assert changed["code_version"] != first["code_version"]
    assert changed["status"].startswith("stale: code version")
    materialized(gateway, "raw")
    np.testing.assert_array_equal(gateway.assets.read("raw"), expected_raw(0.25))
    older = gateway.assets.versions("raw")["versions"][-1]["version"]
    np.testing.assert_array_equal(gateway.assets.read("raw", version=older), expected_raw(0.5))


def test_a_failed_blocking_check_fails_the_operation_and_keeps_the_last_good_version(gateway):
    gateway.assets.define("raw", source(), checks=[{"kind": "in_range", "high": 100}])
    good = materialized(gateway, "raw")["materialized"]["versions"]["raw"]
    gateway.assets.define("raw", source(step=10.0),
                          checks=[{"kind": "in_range", "high": 100},
                                  {"kind": "all_finite", "blocking": False}])
    gateway.assets.define("doubled", reader())
    failed = asyncio.run(gateway.materialize("raw", force=True, wait_seconds=120))
    assert failed["state"] == "failed" and "blocking check in_range failed" in failed["error"]
    assert "outside [-inf, 100]" in failed["error"]
    # what it made is said too: the version kept (not used), and each check
    made = failed["materialized"]
    assert [(c["check"], c["passed"], c["blocking"]) for c in made["checks"]] == \
        [("in_range", False, True), ("all_finite", True, False)]
    newest, kept = gateway.assets.versions("raw")["versions"]
    assert made["versions"] == {"raw": newest["version"]}
    assert not newest["checks_passed"] and kept["checks_passed"] and kept["version"] == good
    np.testing.assert_array_equal(gateway.assets.read("raw"), expected_raw())
    status = {a["name"]: a["status"] for a in gateway.assets.assets()["assets"]}
    assert status["raw"].startswith(f"stale: version {newest['version'][:12]} failed a "
                                    f"blocking check")
    assert status["doubled"] == "never materialized"


def test_an_asset_whose_only_version_failed_its_check_is_stale_not_never_made(gateway):
    gateway.assets.define("raw", source(), checks=[{"kind": "in_range", "high": 1}])
    assert materialized(gateway, "raw")["state"] == "failed"
    [raw] = gateway.assets.assets()["assets"]
    assert raw["status"].startswith("stale: version") and raw["latest_version"] == ""


def test_partitions_are_made_and_read_one_by_one_or_whole(gateway):
    gateway.assets.define("parts", source(shape=(3, 4)), partitions=["a", "b"],
                          partition_axis=0)
    made = materialized(gateway, "parts", partitions=["b"])["materialized"]["versions"]
    assert list(made) == ["parts[b]"]
    np.testing.assert_array_equal(gateway.assets.read("parts", partition="b"),
                                  expected_raw(shape=(3, 4)))
    with pytest.raises(NotFound, match="partitions a have never been materialized"):
        gateway.assets.read("parts")
    materialized(gateway, "parts")
    np.testing.assert_array_equal(gateway.assets.read("parts"),
                                  np.concatenate([expected_raw(shape=(3, 4))] * 2))
    with pytest.raises(NotFound, match="no partition"):
        asyncio.run(gateway.materialize("parts", partitions=["c"]))
    [newest_b] = [v["version"] for v in gateway.assets.versions("parts")["versions"]
                  if v["partition"] == "b"][:1]
    with pytest.raises(InputError, match="is of partition 'b', not 'a'"):
        gateway.assets.read("parts", version=newest_b, partition="a")
    with pytest.raises(InputError, match="ambiguous"):  # "" starts every version
        from deepx_flow.assets.stored import load
        load("parts", version="", db=gateway.db.url)
    with pytest.raises(InputError, match="partition_axis 2 is not an axis of its "
                                         "2-dimensional tensor"):
        gateway.assets.define("parts2", source(shape=(3, 4)), partitions=["a"],
                              partition_axis=2)
    # an unpartitioned asset reading it whole: six rows, not one partition's three
    whole = reader("parts", shape=(6, 4))
    gateway.assets.define("rows", whole)
    assert materialized(gateway, "rows")["state"] == "succeeded"
    np.testing.assert_allclose(gateway.assets.read("rows"),
                               np.concatenate([expected_raw(shape=(3, 4))] * 2).sum(axis=1)
                               * 2.0, rtol=1e-12)
    with pytest.raises(InputError, match=r"input 'parts' is float64\(3, 4\), but asset "
                                         r"parts is float64\(6, 4\) \(2 partitions of "
                                         r"\(3, 4\)\)"):
        gateway.assets.define("rows_bad", reader("parts", shape=(3, 4)))
    gateway.assets.define("apart", source(shape=(3, 4)), partitions=["a", "b"])
    materialized(gateway, "apart")
    with pytest.raises(InputError, match="separate tensors .* give a partition "
                                         r"\(its keys: a, b\)"):
        gateway.assets.read("apart")
    with pytest.raises(NotFound, match="no partition 'c'"):
        gateway.assets.read("parts", partition="c")


def test_a_cancelled_materialization_is_interrupted_and_stores_nothing(gateway, client, db):
    gateway.assets.define("raw", source())
    with faults_on(client, Fault("hang")):
        started = asyncio.run(gateway.materialize("raw", wait_seconds=0.5))
        assert started["state"] == "running"
        answer = asyncio.run(gateway.cancel(started["operation"], 60))
    assert answer["state"] == "interrupted" and "cancelled" in answer["error"]
    with db.read() as s:
        assert s.exec(select(AssetMaterialization)).all() == []
        assert s.get(Run, answer["run_id"]).status == "interrupted"
    assert gateway.assets.assets()["assets"][0]["status"] == "never materialized"


def test_an_upstream_never_made_fails_the_operation_naming_it(gateway):
    gateway.assets.define("raw", source())
    gateway.assets.define("doubled", reader())
    failed = materialized(gateway, "doubled")
    assert failed["state"] == "failed" and "reads raw, which has never been materialized" \
        in failed["error"]


@pytest.mark.parametrize("name, spec, kw, error, says", [
    ("2x", source(), {}, InputError, "not an identifier"),
    ("x", {"deepx": 1, "nodes": [], "outputs": ["y"]}, {}, SpecError, "asset x"),
    ("x", {**source(), "outputs": ["a", "n"]}, {}, SpecError, "2 outputs"),
    ("x", reader("nope"), {}, InputError, "depends on 'nope', which is not defined"),
    ("x", source(), {"dependencies": ["raw", "nope"]}, InputError, "'nope'"),
    ("x", reader(shape=(4, 12)), {}, InputError,
     r"input 'raw' is float64\(4, 12\), but asset raw is float64\(12, 4\)"),
    ("x", source(), {"partitions": ["a", "a"]}, InputError, "keys repeat|given twice"),
    ("x", source(), {"partition_axis": 0}, InputError, "partition_axis needs partitions"),
    ("x", source(), {"checks": ["finite"]}, InputError, "not an object such as"),
    ("x", source(), {"checks": [{"kind": "all_finit"}]}, InputError,
     "check kind 'all_finit' is not one of all_finite, in_range, shape \\(did you mean "
     "'all_finite'\\?\\)"),
    ("x", {**source(), "inputs": {"partition": {"shape": [], "dtype": "int64"}}}, {},
     InputError, "index of the partition .* \\(this asset has no partitions\\)"),
    ("x", {**source(), "inputs": {"partition": {"shape": [], "dtype": "int32"}}},
     {"partitions": ["a"]}, InputError, "int64 scalar"),
    ("x", source(), {"checks": [{"kind": "in_range"}]}, InputError, "low or a high"),
    ("x", source(), {"checks": [{"kind": "in_range", "low": 2, "high": 1}]}, InputError,
     "low is above high"),
    ("x", source(), {"checks": [{"kind": "shape", "shape": [1.5]}]}, InputError, "sizes"),
    ("x", source(), {"checks": [{"kind": "all_finite", "low": 1}]}, InputError, "takes no"),
    ("x", source(), {"checks": [{"kind": "all_finite"}] * 2}, InputError, "named"),
    ("x", source(), {"checks": [{"kind": "in_range", "low": 10 ** 400}]}, InputError,
     "low is not a finite number"),
    ("x", source(), {"checks": [{"kind": "shape", "shape": [10 ** 30]}]}, InputError,
     "sizes"),
])
def test_a_bad_definition_is_refused_and_nothing_is_recorded(gateway, db, name, spec, kw,
                                                             error, says):
    gateway.assets.define("raw", source())
    with pytest.raises(error, match=says):
        gateway.assets.define(name, spec, **kw)
    with db.read() as s:
        assert [r.name for r in s.exec(select(AssetDefinition))] == ["raw"]


def test_redefining_an_upstream_asset_that_no_longer_fits_its_reader_is_refused(gateway, db):
    first = gateway.assets.define("raw", source())
    gateway.assets.define("doubled", reader())
    with pytest.raises(InputError, match=r"asset doubled: input 'raw' is float64\(12, 4\), "
                                         r"but asset raw is float64\(6, 8\)"):
        gateway.assets.define("raw", source(shape=(6, 8)))
    with db.read() as s:
        assert s.get(AssetDefinition, "raw").code_version == first["code_version"]
    gateway.assets.define("raw", source(step=3.0))  # the same shape: fine


def test_a_stored_definition_that_cannot_be_built_is_listed_broken_and_the_rest_served(
        gateway, db):
    gateway.assets.define("raw", source())
    gateway.assets.define("doubled", reader())
    gateway.assets.define("other", source(step=2.0))
    materialized(gateway, "other")
    with db.session() as s:  # as an upgrade that renamed an operator would leave it
        row = s.get(AssetDefinition, "raw")
        row.spec = row.spec.replace('"arange"', '"arange_v0"')
    listed = {a["name"]: a["status"] for a in gateway.assets.assets()["assets"]}
    assert listed["other"] == "fresh"
    assert listed["raw"].startswith("broken: its stored definition cannot be built: ")
    assert "arange_v0" in listed["raw"]
    assert listed["doubled"] == "broken: it depends on asset raw, which is broken"
    for call in (lambda: gateway.assets.read("doubled"),
                 lambda: asyncio.run(gateway.materialize("raw"))):
        with pytest.raises(DeepxError, match="define it again") as err:
            call()
        assert err.value.exit_code != 2  # the server's state, not the request
    np.testing.assert_array_equal(gateway.assets.read("other"), expected_raw(2.0))
    gateway.assets.define("raw", source())  # defined again: served again
    assert materialized(gateway, "raw")["state"] == "succeeded"


def test_a_definition_that_would_make_a_cycle_is_refused_and_the_old_one_kept(gateway, db):
    first = gateway.assets.define("raw", source())
    gateway.assets.define("doubled", reader(shape=(12, 4)))
    cyclic = reader("doubled", shape=(12,))
    cyclic["nodes"][1]["attrs"] = {"axes": [0]}
    with pytest.raises(InputError, match="in a cycle: (raw -> doubled -> raw|doubled -> raw -> doubled)"):
        gateway.assets.define("raw", cyclic)
    with db.read() as s:
        assert s.get(AssetDefinition, "raw").code_version == first["code_version"]


def test_unknown_assets_are_not_found(gateway):
    for call in (lambda: gateway.assets.read("nope"),
                 lambda: gateway.assets.versions("nope"),
                 lambda: asyncio.run(gateway.materialize("nope"))):
        with pytest.raises(NotFound, match="no asset 'nope'"):
            call()
    gateway.assets.define("raw", source())
    with pytest.raises(NotFound, match="has no stored version"):
        gateway.assets.read("raw")
    materialized(gateway, "raw")
    for ranges in ([[0, 13]], {}, 0, [[1]]):
        with pytest.raises(InputError, match="range|not a list"):
            gateway.assets.read("raw", ranges=ranges)
    np.testing.assert_array_equal(gateway.assets.read("raw", ranges=[]), expected_raw())


def test_inputs_by_reference_read_an_asset_or_a_zarr_array(gateway, tmp_path):
    import zarr
    from deepx_flow.contract.tensors import Reference
    gateway.assets.define("raw", source())
    first = materialized(gateway, "raw")["materialized"]["versions"]["raw"]
    gateway.assets.define("raw", source(step=2.0))
    materialized(gateway, "raw")
    stored = zarr.create_array(str(tmp_path / "w.zarr"), shape=(4,), chunks=(2,),
                               dtype="float64")
    stored[:] = np.array([1.0, -1.0, 0.5, 2.0])
    spec = {"deepx": 1, "inputs": {"x": {"shape": [12, 4], "dtype": "float64"},
                                   "w": {"shape": [4], "dtype": "float64"},
                                   "b": {"shape": [], "dtype": "float64"}},
            "nodes": [{"id": "y", "op": "mul", "args": ["x", "w"]},
                      {"id": "z", "op": "add", "args": ["y", "b"]}],
            "outputs": ["z"]}

    def run(x, w, b=np.float64(0.25)):
        answer = asyncio.run(gateway.execute(spec, {"x": x, "w": w, "b": b}))
        assert answer["state"] == "succeeded", answer
        return answer["outputs"]["z"]

    w = Reference("w", zarr_uri=str(tmp_path / "w.zarr"))
    np.testing.assert_array_equal(run(Reference("x", asset="raw"), w),
                                  expected_raw(2.0) * stored[:] + 0.25)
    np.testing.assert_array_equal(run(Reference("x", asset="raw", version=first[:8]),
                                      np.array([1.0, 1.0, 1.0, 1.0])), expected_raw() + 0.25)
    for x, says in [(Reference("x", asset="nope"), "input 'x': no asset 'nope' is defined"),
                    (Reference("x", asset="raw", datatype="FP32"), "said to be FP32"),
                    (Reference("x", asset="raw", shape=(4, 12)), "said to have shape"),
                    (Reference("x", zarr_uri=str(tmp_path / "none.zarr")), "none.zarr"),
                    (w, "input 'x' is float64(12, 4) in the graph, given float64(4,)")]:
        with pytest.raises(InputError, match=says.replace("(", r"\(").replace(")", r"\)")):
            run(x, w)
    with pytest.raises(InputError, match="given by reference, but the graph's inputs"):
        asyncio.run(gateway.execute(spec, {"x": expected_raw(), "w": w, "b": np.float64(0),
                                           "v": Reference("v", asset="raw")}))


def test_two_definitions_at_once_cannot_record_a_cycle_between_them(gateway):
    """Each alone is fine; together they make a cycle: the definitions' lock lets one in
    and the other, checked after it, is refused (without it both were recorded)."""
    import threading

    from deepx_flow.gateway.asset_calls import AssetCalls
    for attempt in range(8):
        a, b = f"a{attempt}", f"b{attempt}"
        gateway.assets.define(a, source(shape=(12, 4)))
        gateway.assets.define(b, source(shape=(12, 4)))
        # two gateways' calls: each its own AssetCalls on the same database
        calls = [AssetCalls(gateway.db, gateway.operations, gateway.client, 1000)
                 for _ in range(2)]
        barrier, outcomes = threading.Barrier(2), []

        def define(calls, name, upstream):
            spec = reader(upstream)
            spec["nodes"].append({"id": "r", "op": "reshape", "args": ["s"],
                                  "shape": [12, 1]})
            spec["nodes"].append({"id": "t", "op": "mul", "args": [upstream, "r"]})
            spec["outputs"] = ["t"]
            barrier.wait()
            try:
                calls.define(name, spec)
                outcomes.append("defined")
            except InputError as err:
                outcomes.append(str(err))

        threads = [threading.Thread(target=define, args=(calls[0], a, b)),
                   threading.Thread(target=define, args=(calls[1], b, a))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        first, second = sorted(outcomes, key=lambda o: o != "defined")
        assert first == "defined" and "in a cycle" in second, outcomes
    gateway.assets.assets()  # and what is recorded still builds


def test_upstream_assets_are_made_on_request_and_partitions_see_their_index(gateway):
    gateway.assets.define("raw", source())
    gateway.assets.define("doubled", reader())
    made = materialized(gateway, "doubled", upstream=True)["materialized"]
    assert sorted(made["versions"]) == ["doubled", "raw"]
    again = materialized(gateway, "doubled", upstream=True)["materialized"]
    assert again["versions"] == {} and again["skipped"] == {"doubled": "fresh"}
    # a partitioned source whose graph reads its partition's index: partitions differ
    spec = {"deepx": 1, "inputs": {"partition": {"shape": [], "dtype": "int64"}},
            "nodes": [{"id": "n", "op": "arange", "shape": [4], "dtype": "float64",
                       "attrs": {"start": 0.0, "step": 1.0}},
                      {"id": "i", "op": "cast", "args": ["partition"], "dtype": "float64"},
                      {"id": "y", "op": "add", "args": ["n", "i"]},
                      {"id": "r", "op": "reshape", "args": ["y"], "shape": [1, 4]}],
            "outputs": ["r"]}
    gateway.assets.define("days", spec, partitions=["mon", "tue", "wed"], partition_axis=0)
    made = materialized(gateway, "days")["materialized"]
    assert sorted(made["versions"]) == ["days[mon]", "days[tue]", "days[wed]"]
    np.testing.assert_array_equal(gateway.assets.read("days"),
                                  np.arange(4.0)[None, :] + np.arange(3.0)[:, None])
    [days] = [a for a in gateway.assets.assets()["assets"] if a["name"] == "days"]
    assert days["partition_axis"] == 0 and days["partitions"] == ["mon", "tue", "wed"]
    assert materialized(gateway, "days", partitions=["tue"])["materialized"]["skipped"] == \
        {"days[tue]": "fresh"}
