"""Assets through a real `deepx-flow serve` process: defined, materialized, listed and read
over HTTP, over gRPC and through dx.connect, their values NumPy's; bad requests get their
status; definitions outlive the gateway, and a materialization killed with it is final and
left no version."""

import json

import grpc
import httpx
import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.contract import tensors
from deepx_flow.contract.deepx.v1 import catalog_pb2, catalog_pb2_grpc, tensor_pb2
from tests.gateway.test_asset_calls import expected_raw, reader, source
from tests.gateway.test_serve import Served, tcp_client  # noqa: F401 (a fixture)

BIG = (1024, 2048)  # float64: 16 MiB, four times gRPC's message limit


def _define(url, body):
    answer = httpx.post(url + "/v1/assets:define", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _materialize(url, name, **body):
    answer = httpx.post(f"{url}/v1/assets/{name}:materialize",
                        json={"wait_seconds": 120, **body}, timeout=180)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _read_stream(stub, **ref):
    """A ReadAsset call's tensor, its chunks assembled."""
    slices = ref.pop("slice", [])
    messages = list(stub.ReadAsset(catalog_pb2.ReadAssetRequest(
        asset=tensor_pb2.AssetReference(**ref),
        slice=[catalog_pb2.Range(start=a, stop=b) for a, b in slices]), timeout=120))
    header = messages[0].tensor
    raw = b"".join(m.chunk.data for m in messages[1:])
    assert all(m.WhichOneof("part") == "chunk" for m in messages[1:])
    return tensors.from_message(header, raw if header.streamed else None), messages


@pytest.mark.timeout(600)
def test_assets_over_http_grpc_and_dx_connect(tmp_path):
    served = Served(tmp_path)
    try:
        want = _over_http(served.url)  # each step on what the ones before stored
        _by_reference(served)
        _bad_requests(served.url)
        _over_grpc(served)
        _through_dx_connect(served.url)
    finally:
        assert served.stop() == 0

    # another gateway on the same database serves the same assets and versions
    again = Served(tmp_path)
    try:
        listed = dx.connect(again.url).assets()
        assert [a["name"] for a in listed] == ["raw", "doubled", "big", "centered",
                                               "negative"]
        assert dict((a["name"], a["status"]) for a in listed)["doubled"] == "fresh"
        np.testing.assert_allclose(dx.connect(again.url).load("doubled"), want, rtol=1e-12)
    finally:
        assert again.stop() == 0


@pytest.mark.timeout(300)
def test_a_materialization_killed_with_its_gateway_is_interrupted_and_left_no_version(
        tmp_path, tcp_client):
    from deepx_flow.kernels.faults import Fault
    from tests.helpers import faults_on
    served = Served(tmp_path, "--scheduler", tcp_client.scheduler.address)
    _define(served.url, {"name": "raw", "graph": source()})
    with faults_on(tcp_client, Fault("hang")):
        running = httpx.post(served.url + "/v1/assets/raw:materialize", timeout=60,
                             json={"wait_seconds": 0.5, "operation_id": "m1"}).json()
        assert running["state"] == "running" and running["kind"] == "materialize"
        served.proc.kill()
        served.proc.wait(60)
    again = Served(tmp_path, "--scheduler", tcp_client.scheduler.address)
    try:
        found = httpx.get(again.url + "/v1/operations/m1", timeout=60).json()
        assert found["state"] == "interrupted" and "materialized" not in found
        assert httpx.get(again.url + "/v1/assets/raw/versions",
                         timeout=60).json()["versions"] == []
        [raw] = httpx.get(again.url + "/v1/assets", timeout=60).json()["assets"]
        assert raw["status"] == "never materialized"
        made = _materialize(again.url, "raw")
        assert made["state"] == "succeeded"
        np.testing.assert_array_equal(dx.connect(again.url).load("raw"), expected_raw())
    finally:
        assert again.stop() == 0


SUMMED = {"deepx": 1, "inputs": {"x": {"shape": [12, 4], "dtype": "float64"}},
          "nodes": [{"id": "s", "op": "sum", "args": ["x"], "attrs": {"axes": [0]}}],
          "outputs": ["s"]}


def _over_http(url):
    """Define, materialize, read, list over HTTP; the doubled asset's values."""
    _define(url, {"name": "raw", "graph": source()})
    defined = _define(url, {"name": "doubled", "graph": reader(),
                            "checks": [{"kind": "all_finite"},
                                       {"kind": "shape", "shape": [-1]}]})
    assert defined["checks"] == [{"kind": "all_finite"}, {"kind": "shape", "shape": [-1]}]
    assert _materialize(url, "doubled")["state"] == "failed"  # raw never made
    made = _materialize(url, "raw")["materialized"]
    assert made["versions"].keys() == {"raw"} and made["run_ids"]
    made = _materialize(url, "doubled")["materialized"]
    assert [c["check"] for c in made["checks"]] == ["all_finite", "shape"]
    assert all(c["passed"] for c in made["checks"])

    want = (expected_raw() * 2.0).sum(axis=1)
    as_json = httpx.post(url + "/v1/assets/doubled:read", json={}, timeout=60).json()
    [tensor] = as_json["outputs"]
    assert tensor["datatype"] == "FP64" and tensor["shape"] == [12]
    np.testing.assert_allclose(tensor["data"], want, rtol=1e-12)
    part = httpx.post(url + "/v1/assets/raw:read", timeout=60, json={
        "slice": [[2, 4]], "parameters": {"binary_data_output": True}})
    length = int(part.headers[tensors.BINARY_HEADER])
    [header] = json.loads(part.content[:length])["outputs"]
    got = tensors.from_json_list([header], part.content[length:], "outputs")["raw"]
    np.testing.assert_array_equal(got, expected_raw()[2:4])

    listed = httpx.get(url + "/v1/assets", timeout=60).json()["assets"]
    assert [(a["name"], a["status"]) for a in listed] == [("raw", "fresh"),
                                                           ("doubled", "fresh")]
    [version] = httpx.get(url + "/v1/assets/doubled/versions", timeout=60).json()[
        "versions"]
    assert version["lineage"] == {"raw": listed[0]["latest_version"]}

    return want


def _by_reference(served):
    url = served.url
    # a graph executed on a stored asset, read by reference, over HTTP and gRPC
    answer = httpx.post(url + "/v1/graphs:execute", timeout=120, json={
        "graph": SUMMED, "inputs": [{"name": "x", "reference": {"asset": {"name": "raw"}},
                                     "datatype": "FP64", "shape": [12, 4]}]}).json()
    np.testing.assert_allclose(answer["outputs"][0]["data"], expected_raw().sum(axis=0),
                               rtol=1e-12)
    from deepx_flow.contract.deepx.v1 import graphs_pb2, graphs_pb2_grpc
    with grpc.insecure_channel(served.grpc) as channel:
        header = graphs_pb2.ExecuteGraphHeader(graph_json=json.dumps(SUMMED), inputs=[
            tensor_pb2.Tensor(name="x", reference=tensor_pb2.TensorReference(
                asset=tensor_pb2.AssetReference(name="raw")))])
        [done] = graphs_pb2_grpc.GraphServiceStub(channel).ExecuteGraph(
            iter([graphs_pb2.ExecuteGraphRequest(header=header)]), timeout=120)
        np.testing.assert_allclose(tensors.from_message(done.operation.outputs[0]),
                                   expected_raw().sum(axis=0), rtol=1e-12)
        header.outputs.append(tensor_pb2.Tensor(name="s", reference=tensor_pb2.
                                                TensorReference(zarr_uri="/tmp/s.zarr")))
        with pytest.raises(grpc.RpcError) as err:
            list(graphs_pb2_grpc.GraphServiceStub(channel).ExecuteGraph(
                iter([graphs_pb2.ExecuteGraphRequest(header=header)]), timeout=120))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not served yet" in err.value.details()


def _bad_requests(url):
    # bad requests: their status and the DeepxError's text
    for path, body, status, says in [
            ("/v1/assets:define", {"name": "x", "graph": reader("nope")}, 400,
             "depends on 'nope', which is not defined"),
            ("/v1/assets:define", {"name": "x"}, 400, "no 'graph'"),
            ("/v1/assets:define", {"name": "x", "graph": source(), "what": 1}, 400,
             "unknown field"),
            ("/v1/assets/nope:read", {}, 404, "no asset 'nope'"),
            ("/v1/assets/nope:materialize", {}, 404, "no asset 'nope'"),
            ("/v1/assets/raw:read", {"slice": [[0, 99]]}, 400, "range"),
            ("/v1/assets/raw:materialize", {"force": "yes"}, 400, "force"),
            ("/v1/graphs:execute", {"graph": SUMMED, "inputs": [
                {"name": "x", "reference": {"asset": {"name": "doubled"}}}]}, 400,
             "input 'x' is float64(12, 4) in the graph, given float64(12,)"),
            ("/v1/graphs:execute", {"graph": SUMMED, "inputs": [
                {"name": "x", "reference": {"disk": "/etc"}}]}, 400,
             "not {\"zarr_uri\": URI}"),
            ("/v1/graphs:execute", {"graph": SUMMED, "inputs": [
                {"name": "x", "reference": {"asset": {"name": "nope"}}}]}, 404,
             "input 'x': no asset 'nope' is defined"),
            ("/v1/graphs:execute", {"graph": SUMMED, "inputs": [
                {"name": "x", "reference": {"asset": {"name": "raw"}}}],
                "outputs": [{"name": "s", "reference": {"zarr_uri": "/tmp/s.zarr"}}]},
             400, "outputs written to storage by reference are in the contract but not "
                  "served yet")]:
        answer = httpx.post(url + path, json=body, timeout=60)
        assert answer.status_code == status and says in answer.json()["error"], \
            (path, answer.text)
    assert httpx.get(url + "/v1/assets/nope/versions", timeout=60).status_code == 404



def _over_grpc(served):
    # gRPC: the same calls, a large read streamed in bounded chunks
    with grpc.insecure_channel(served.grpc) as channel:
        stub = catalog_pb2_grpc.CatalogServiceStub(channel)
        big = stub.DefineAsset(catalog_pb2.DefineAssetRequest(
            name="big", graph_json=json.dumps(source(0.25, BIG)),
            checks=[catalog_pb2.AssetCheck(kind="in_range", low=0.0)]), timeout=60)
        assert big.checks[0].kind == "in_range" and big.checks[0].low == 0.0
        [done] = list(stub.MaterializeAsset(catalog_pb2.MaterializeAssetRequest(
            name="big", wait_seconds=300), timeout=360))
        assert done.operation.state == "succeeded", done.operation.error
        assert list(done.operation.materialized.versions) == ["big"]
        whole, messages = _read_stream(stub, name="big")
        assert len(messages) > 4 and all(m.ByteSize() <= 4 << 20 for m in messages)
        np.testing.assert_array_equal(whole, expected_raw(0.25, BIG))
        rows, _ = _read_stream(stub, name="big", slice=[(5, 9), (100, 103)])
        np.testing.assert_array_equal(rows, expected_raw(0.25, BIG)[5:9, 100:103])
        names = [a.name for a in stub.ListAssets(catalog_pb2.ListAssetsRequest()).assets]
        assert names == ["raw", "doubled", "big"]
        [v] = stub.ListAssetVersions(catalog_pb2.ListAssetVersionsRequest(
            name="big")).versions
        assert v.shape == list(BIG) and v.datatype == "FP64" and v.checks_passed
        for call, code in [
                (lambda: stub.DefineAsset(catalog_pb2.DefineAssetRequest(
                    name="x", graph_json="{"), timeout=60),
                 grpc.StatusCode.INVALID_ARGUMENT),
                (lambda: stub.DefineAsset(catalog_pb2.DefineAssetRequest(
                    name="x", graph_json=json.dumps(source()),
                    checks=[catalog_pb2.AssetCheck(kind="finite")]), timeout=60),
                 grpc.StatusCode.INVALID_ARGUMENT),
                (lambda: _read_stream(stub, name="nope"), grpc.StatusCode.NOT_FOUND)]:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == code



def _through_dx_connect(url):
    # dx.connect: an asset defined by SDK code, materialized, loaded; a persisted run
    remote = dx.connect(url)
    raw = dx.input("raw", (12, 4), "float64")
    remote.define("centered", raw - raw.mean(axis=0), description="raw, centered")
    made = remote.materialize("centered")
    assert list(made["versions"]) == ["centered"]
    np.testing.assert_allclose(remote.load("centered"),
                               expected_raw() - expected_raw().mean(axis=0),
                               rtol=0, atol=1e-12 * np.abs(expected_raw()).max())
    np.testing.assert_array_equal(remote.load("raw", slice=[[0, 1]]), expected_raw()[:1])
    assert remote.materialize("centered") == {"versions": {}, "run_ids": [],
                                              "skipped": {"centered": "fresh"},
                                              "checks": []}
    assert [v["version"] for v in remote.versions("centered")] == \
        list(made["versions"].values())
    with pytest.raises(dx.DeepxError, match="blocking check in_range failed"):
        remote.define("negative", raw - 100.0, checks=[{"kind": "in_range", "low": 0}])
        remote.materialize("negative")
    with pytest.raises(dx.DeepxError, match="has no stored version"):
        remote.load("negative")
    x = dx.input("x", (3, 4), "float64")
    handle = remote.persist(x * 3.0, inputs={"x": expected_raw(shape=(3, 4))})
    assert handle.shape == (3, 4)
    np.testing.assert_array_equal(handle.to_numpy(), expected_raw(shape=(3, 4)) * 3.0)
