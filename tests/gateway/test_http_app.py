"""The HTTP/JSON mirror (`gateway/http_app.py`), served by uvicorn on loopback in this
process: each call's answer, JSON and binary tensors, and each bad request's status and
message."""

import json
import threading
import time

import httpx
import numpy as np
import pytest
import uvicorn

import deepx_flow as dx
from deepx_flow.gateway.capabilities import Limits
from deepx_flow.gateway.graphs import graph_of
from deepx_flow.gateway.http_app import make_app
from deepx_flow.gateway.http_bodies import HEADER_LENGTH
from deepx_flow.gateway.service import Gateway
from deepx_flow.meta import open_db
from tests.helpers import free_port

SPEC = {"deepx": 1, "inputs": {"x": {"shape": [3, 4], "dtype": "float32"}},
        "nodes": [{"id": "y", "op": "exp", "args": ["x"]},
                  {"id": "s", "op": "sum", "args": ["y"], "attrs": {"axes": [0]}}],
        "outputs": ["y", "s"]}


@pytest.fixture
def http(client, tmp_path):
    gateway = Gateway(client, open_db(), tmp_path / "results",
                      Limits(max_request_bytes=1 << 20, max_json_bytes=256 << 10))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(gateway), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http_client:
            yield http_client
    finally:
        server.should_exit = True
        thread.join(30)


def _x():
    return np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


def _want(client, x):
    return dx.run(graph_of(SPEC, 100), inputs={"x": x}, client=client)


def test_capabilities(http):
    answer = http.get("/v1/capabilities")
    assert answer.status_code == 200 and answer.json()["protocol_version"] == "deepx.v1"


def test_analyze(http):
    answer = http.post("/v1/graphs:analyze", json={"graph": SPEC})
    assert answer.status_code == 200
    assert answer.json()["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, 4]},
                                        {"name": "s", "datatype": "FP32", "shape": [4]}]


def test_execute_with_json_tensors(http, client):
    x = _x()
    answer = http.post("/v1/graphs:execute", json={
        "graph": SPEC, "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]})
    assert answer.status_code == 200
    body = answer.json()
    assert body["state"] == "succeeded" and body["run_id"]
    want = _want(client, x)
    for tensor in body["outputs"]:
        got = np.array(tensor["data"], np.float32).reshape(tensor["shape"])
        np.testing.assert_array_equal(got, want[tensor["name"]])
    again = http.get(f"/v1/operations/{body['operation']}").json()
    assert again["outputs"] == body["outputs"]


def test_execute_with_binary_tensors(http, client):
    x = _x()
    head = json.dumps({"graph": SPEC, "outputs": [{"name": "s",
                                                   "parameters": {"binary_data": True}}],
                       "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    answer = http.post("/v1/graphs:execute", content=head + x.tobytes(),
                       headers={HEADER_LENGTH: str(len(head)),
                                "Content-Type": "application/octet-stream"})
    assert answer.status_code == 200
    n = int(answer.headers[HEADER_LENGTH])
    body = json.loads(answer.content[:n])
    [s] = body["outputs"]
    assert s["parameters"] == {"binary_data_size": 16}
    got = np.frombuffer(answer.content[n:], "<f4")
    np.testing.assert_array_equal(got, _want(client, x)["s"])


def test_a_run_outlasting_the_wait_answers_running_then_its_results(http, client):
    from deepx_flow.kernels.faults import Fault
    from tests.helpers import faults_on
    x = _x()
    with faults_on(client, Fault("hang")):
        body = http.post("/v1/graphs:execute", json={
            "graph": SPEC, "wait_seconds": 0.2, "operation_id": "slow-1",
            "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                        "data": x.ravel().tolist()}]}).json()
        assert body["state"] == "running" and "outputs" not in body
        deadline = time.monotonic() + 30
        while "progress" not in body and time.monotonic() < deadline:  # (once submitted)
            time.sleep(0.05)
            body = http.get("/v1/operations/slow-1").json()
        # a hung task: the run is under way, not done
        total = body["progress"]["tasks_total"]
        assert total > 0 and 0 <= body["progress"]["tasks_done"] < total
        assert body["dashboard"].endswith(f"/run?id={body['run_id']}")
    done = http.get("/v1/operations/slow-1?wait_seconds=60").json()
    assert done["state"] == "succeeded"
    assert done["progress"] == {"tasks_done": total, "tasks_total": total}
    assert done["dashboard"] == body["dashboard"]


@pytest.mark.parametrize("body, status, says", [
    (b"{", 400, "not JSON"),
    (b"[1]", 400, "not a JSON object"),
    (b"[" * 2000 + b"]" * 2000, 400, "nested too deep"),
    (b'{"graph": NaN}', 400, "not JSON"),  # (non-finite numbers travel as strings)
    (b'{"graph": 1' + b"0" * 400 + b"}", 400, "beyond the range of a 64-bit float"),
    (json.dumps({"graph": SPEC, "inputs": []}).encode(), 400, "input 'x'"),
    (json.dumps({"graph": SPEC, "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                            "data": [0.0] * 8}]}).encode(), 400, "'x'"),
    (json.dumps({"graph": {**SPEC, "nodes": [{"id": "y", "op": "exq", "args": ["x"]}]},
                 "inputs": []}).encode(), 400, "exq"),
    (json.dumps({"graph": SPEC, "inputs": [], "colour": 1}).encode(), 400, "unknown field"),
    (json.dumps({"inputs": []}).encode(), 400, "no 'graph'"),
    (json.dumps({"graph": SPEC, "inputs": [], "wait_seconds": -1}).encode(), 400,
     "wait_seconds"),
    (b" " * (2 << 20), 413, "over the limit"),
    (json.dumps({"graph": SPEC, "inputs": [], "wait_seconds": 1e10}).encode(), 400,
     "wait_seconds"),
    (json.dumps({"graph": SPEC, "inputs": [], "outputs": [{"name": "y",
                                                           "parameters": [1]}]}).encode(),
     400, "an output is"),
])
def test_bad_requests_get_their_status_and_the_deepx_error_text(http, body, status, says):
    answer = http.post("/v1/graphs:execute", content=body)
    assert answer.status_code == status, answer.text
    assert says in answer.json()["error"]
    assert http.get("/v1/capabilities").status_code == 200  # and it keeps serving


def test_a_bfloat16_result_comes_back_as_bfloat16_in_json_and_binary(http):
    """Results are kept as .npy files, which have no bfloat16 (they hold void `<V2`): read
    back, they are bfloat16 again."""
    import ml_dtypes
    spec = {"deepx": 1, "inputs": {"x": {"shape": [3], "dtype": "bfloat16"}},
            "nodes": [{"id": "y", "op": "flip", "args": ["x"]}], "outputs": ["y"]}
    x = np.array([1.5, -2.0, 3.0], ml_dtypes.bfloat16)
    answer = http.post("/v1/graphs:execute", json={"graph": spec, "inputs": [
        {"name": "x", "shape": [3], "datatype": "BF16", "data": [1.5, -2.0, 3.0]}]})
    assert answer.status_code == 200, answer.text
    [y] = answer.json()["outputs"]
    assert y["datatype"] == "BF16" and y["data"] == [3.0, -2.0, 1.5]
    head = json.dumps({"graph": spec, "parameters": {"binary_data_output": True},
                       "inputs": [{"name": "x", "shape": [3], "datatype": "BF16",
                                   "parameters": {"binary_data_size": 6}}]}).encode()
    answer = http.post("/v1/graphs:execute", content=head + x.tobytes(),
                       headers={HEADER_LENGTH: str(len(head)),
                                "Content-Type": "application/octet-stream"})
    assert answer.status_code == 200, answer.text
    n = int(answer.headers[HEADER_LENGTH])
    assert json.loads(answer.content[:n])["outputs"][0]["datatype"] == "BF16"
    np.testing.assert_array_equal(np.frombuffer(answer.content[n:], ml_dtypes.bfloat16),
                                  x[::-1])


def test_unknown_operations_are_404(http):
    assert http.get("/v1/operations/nope").status_code == 404
    assert http.post("/v1/operations/nope:cancel").status_code == 404


def test_an_error_says_its_kind_as_pythons_class_name(http):
    """What every SDK's error carries: the kind beside the message (not on the Open
    Inference Protocol's calls, whose errors are the protocol's)."""
    unknown_op = {"graph": {**SPEC, "nodes": [{"id": "y", "op": "exq", "args": ["x"]}]},
                  "inputs": []}
    for answer, kind in [
            (http.post("/v1/graphs:execute", json=unknown_op), "GraphError"),
            (http.post("/v1/graphs:execute", json={"graph": SPEC, "inputs": []}),
             "InputError"),
            (http.post("/v1/graphs:execute", json={"graph": {"deepx": 7}}), "SpecError"),
            (http.get("/v1/operations/nope"), "NotFound"),
            (http.post("/v1/graphs:execute", content=b" " * (2 << 20)), "TooLarge")]:
        assert answer.json()["kind"] == kind, answer.json()
    protocol = http.get("/v2/models/nope")
    assert protocol.status_code == 404 and set(protocol.json()) == {"error"}


def test_unknown_calls_and_methods_are_said_in_json(http):
    answer = http.get("/v1/nothing")
    assert answer.status_code == 404
    assert answer.json()["error"] == "no call GET /v1/nothing in the contract " \
                                     "(docs/contract.md lists its calls)"
    answer = http.post("/v1/assets/a%2Fb:read", json={})  # the %2F is a / again
    assert answer.status_code == 404 and "no call POST /v1/assets/a/b:read" in \
        answer.json()["error"]
    answer = http.delete("/v1/runs")
    assert answer.status_code == 405 and answer.json()["error"] == \
        "DELETE is not a method of /v1/runs in the contract"
    assert set(answer.headers["allow"].split(", ")) == {"GET", "HEAD"}  # in any order


def test_runs_are_listed_newest_first_and_found_by_id(http, client):
    x = _x()
    body = http.post("/v1/graphs:execute", json={
        "graph": SPEC, "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).json()
    listed = http.get("/v1/runs?limit=5").json()["runs"]
    assert listed[0]["id"] == body["run_id"] and listed[0]["status"] == "succeeded"
    assert [r["started_at"] for r in listed] == sorted((r["started_at"] for r in listed),
                                                       reverse=True)
    one = http.get(f"/v1/runs/{body['run_id']}").json()
    assert one == listed[0]
    assert http.get(f"/v1/runs/{body['run_id'][:10]}").json() == one  # a prefix
    assert http.get("/v1/runs/ffffffffffffffffffff").status_code == 404
    assert http.get("/v1/runs?status=lost").status_code == 400
    assert http.get("/v1/runs?limit=-1").status_code == 400
    succeeded = http.get("/v1/runs?status=succeeded&limit=3").json()["runs"]
    assert succeeded and all(r["status"] == "succeeded" for r in succeeded)


def test_the_registry_lists_the_clusters_workers(http, client):
    from deepx_flow.registry.register import register_cluster
    register_cluster(client, open_db())
    answer = http.get("/v1/registry")
    assert answer.status_code == 200
    workers = answer.json()["workers"]
    assert sorted(w["address"] for w in workers) == sorted(client.scheduler_info()["workers"])
    assert all(w["status"] == "running" and w["threads"] >= 1 for w in workers)


def test_headers_and_queries_that_are_not_numbers_are_400s(http):
    assert http.get("/v1/runs?limit=\u00b2").status_code == 400
    assert http.get("/v1/operations/x?wait_seconds=1e10").status_code in (400, 404)
    head = json.dumps({"graph": SPEC, "inputs": []}).encode()
    answer = http.post("/v1/graphs:execute", content=head,
                       headers={HEADER_LENGTH: "\u00b2".encode()})
    assert answer.status_code == 400 and HEADER_LENGTH in answer.json()["error"]


def test_a_body_without_a_declared_length_is_bounded_as_it_is_read(http):
    def chunks():
        for _ in range(3):
            yield b" " * (512 << 10)
    answer = http.post("/v1/graphs:execute", content=chunks())  # chunked: no length
    assert answer.status_code == 413 and "over the limit" in answer.json()["error"]


def test_capabilities_offer_only_what_is_served(http):
    assert http.get("/v1/capabilities").json()["extensions"] == ["binary_tensor_data",
                                                                 "tensor_streaming", "assets",
                                                                 "input_references"]


@pytest.mark.timeout(120)
def test_a_running_operation_is_cancelled_over_http(http, client):
    from deepx_flow.kernels.faults import Fault
    from tests.helpers import faults_on
    with faults_on(client, Fault("hang")):
        body = http.post("/v1/graphs:execute", json={
            "graph": SPEC, "wait_seconds": 0.2, "operation_id": "to-cancel",
            "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                        "data": _x().ravel().tolist()}]}).json()
        assert body["state"] == "running"
        cancelled = http.post("/v1/operations/to-cancel:cancel").json()
    assert cancelled["state"] == "interrupted" and "cancelled" in cancelled["error"]
    assert "outputs" not in cancelled
    assert http.get(f"/v1/runs/{cancelled['run_id']}").json()["status"] == "interrupted"


def test_cancelling_an_operation_that_ended_changes_nothing_and_answers_no_outputs(http):
    body = http.post("/v1/graphs:execute", json={
        "graph": SPEC, "operation_id": "done-before",
        "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                    "data": _x().ravel().tolist()}]}).json()
    assert body["state"] == "succeeded" and body["outputs"]
    cancelled = http.post("/v1/operations/done-before:cancel").json()
    assert cancelled["state"] == "succeeded" and "outputs" not in cancelled
    # (its outputs are kept: asked for again, they come)
    assert http.get("/v1/operations/done-before").json()["outputs"] == body["outputs"]


def test_many_waiting_calls_hold_no_thread_a_cancel_needs(http, client):
    """Fifty calls waiting on hung operations (more than the servers' thread pools) do not
    keep a cancel from being answered."""
    import concurrent.futures
    from deepx_flow.kernels.faults import Fault
    from tests.helpers import faults_on
    request = {"graph": SPEC, "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                          "data": _x().ravel().tolist()}]}
    with faults_on(client, Fault("hang")):
        http.post("/v1/graphs:execute", json={**request, "operation_id": "hung-0",
                                              "wait_seconds": 0})
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            waiting = [pool.submit(http.get, "/v1/operations/hung-0?wait_seconds=30")
                       for _ in range(50)]
            time.sleep(1.0)
            began = time.monotonic()
            cancelled = http.post("/v1/operations/hung-0:cancel").json()
            assert time.monotonic() - began < 15
            assert cancelled["state"] == "interrupted"
            assert all(f.result().json()["state"] == "interrupted" for f in waiting)


def test_a_large_json_part_is_refused_but_the_same_tensor_as_binary_data_runs(http, client):
    spec = {"deepx": 1, "inputs": {"x": {"shape": [40_000], "dtype": "float64"}},
            "nodes": [{"id": "y", "op": "neg", "args": ["x"]}], "outputs": ["y"]}
    x = np.random.default_rng(2).standard_normal(40_000)  # 320 KB as bytes, ~800 KB as JSON
    as_json = http.post("/v1/graphs:execute", json={"graph": spec, "inputs": [
        {"name": "x", "shape": [40_000], "datatype": "FP64", "data": x.tolist()}]})
    assert as_json.status_code == 413 and "as binary data" in as_json.json()["error"]
    head = json.dumps({"graph": spec, "inputs": [{"name": "x", "shape": [40_000],
                                                  "datatype": "FP64", "parameters": {
                                                      "binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    answer = http.post("/v1/graphs:execute", content=head + x.tobytes(),
                       headers={HEADER_LENGTH: str(len(head))})
    assert answer.status_code == 200
    n = int(answer.headers[HEADER_LENGTH])
    np.testing.assert_array_equal(np.frombuffer(answer.content[n:], "<f8"), -x)
