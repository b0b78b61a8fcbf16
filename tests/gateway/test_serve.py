"""`deepx-flow serve` as users start it: a real process on loopback, called from this one;
refused on another address without credentials; a wrong token is 401; SIGTERM stops it."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.gateway.graphs import graph_of

SPEC = {"deepx": 1, "inputs": {"x": {"shape": [5, 3], "dtype": "float64"}},
        "nodes": [{"id": "y", "op": "tanh", "args": ["x"]},
                  {"id": "m", "op": "max", "args": ["y"], "attrs": {"axes": [1]}}],
        "outputs": ["m"]}


class Served:
    """`deepx-flow serve` started with `args` in `folder`, its HTTP port read from its
    first line."""

    def __init__(self, folder, *args, env=None):
        environ = {**os.environ, "DEEPX_DB_URL": f"sqlite:///{folder / 'gw.db'}", **(env or {})}
        if env and env.get("DEEPX_DB_URL") is None and "DEEPX_DB_URL" in env:
            environ["DEEPX_DB_URL"] = os.environ["DEEPX_DB_URL"]  # this process's
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deepx_flow.cli.main", "serve", "--http-port", "0",
             "--grpc-port", "0", "--metrics-port", "0",
             "--results", str(folder / "results"), *args],
            cwd=folder, env=environ, stderr=subprocess.PIPE, text=True)
        deadline, line = time.monotonic() + 120, ""
        while "HTTP on" not in line:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}")
            assert time.monotonic() < deadline, "serve did not start"
        found = re.search(r"HTTP on (\S+), gRPC on (\S+), metrics on (\S+)", line)
        self.url, self.grpc = "http://" + found.group(1), found.group(2).rstrip(",")
        self.metrics = "http://" + found.group(3)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.mark.timeout(300)
def test_a_served_graph_gives_dx_runs_results_and_sigterm_stops_the_server(tmp_path, client):
    served = Served(tmp_path)
    try:
        x = np.random.default_rng(3).standard_normal((5, 3))
        body = {"graph": SPEC, "inputs": [{"name": "x", "shape": [5, 3], "datatype": "FP64",
                                           "data": x.ravel().tolist()}]}
        answer = httpx.post(served.url + "/v1/graphs:execute", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        [m] = answer.json()["outputs"]
        # another cluster and database (its own measured speeds may pick another engine
        # for tanh): equal to within tanh's rounding, not to the bit
        want = dx.run(graph_of(SPEC, 10), inputs={"x": x}, client=client)["m"]
        np.testing.assert_allclose(np.array(m["data"]), want, rtol=4e-16, atol=0)
        np.testing.assert_allclose(want, np.tanh(x).max(axis=1), rtol=4e-16, atol=0)
    finally:
        assert served.stop() == 0


def test_another_address_without_credentials_is_refused_at_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "serve",
                           "--address", "0.0.0.0", "--http-port", "0"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items()
                               if k != "DEEPX_GATEWAY_TOKEN"})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "without authentication" in done.stderr


@pytest.mark.timeout(300)
def test_a_token_is_required_once_set(tmp_path):
    served = Served(tmp_path, env={"DEEPX_GATEWAY_TOKEN": "s3cret"})
    try:
        url = served.url + "/v1/capabilities"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        # the health checks alone are open (orchestrators' probes send no credentials)
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert httpx.get(served.url + path).status_code == 200
        for path in ("/v2", "/v2/models/stats", "/metrics", "/v2/health/live/x"):
            assert httpx.get(served.url + path).status_code == 401, path
        assert httpx.post(served.url + "/v2/models/m/infer", json={}).status_code == 401
        assert httpx.get(served.metrics + "/metrics").status_code == 401
        import grpc
        from deepx_flow.contract.deepx.v1 import graphs_pb2, graphs_pb2_grpc
        with grpc.insecure_channel(served.grpc) as channel:
            stub = graphs_pb2_grpc.GraphServiceStub(channel)
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.RpcError) as err:
                    stub.GetCapabilities(graphs_pb2.GetCapabilitiesRequest(),
                                         metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.RpcError) as err:  # a streaming call too
                    list(stub.GetOperation(graphs_pb2.GetOperationRequest(id="x"),
                                           metadata=metadata))
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            caps = stub.GetCapabilities(graphs_pb2.GetCapabilitiesRequest(),
                                        metadata=(("authorization", "Bearer s3cret"),))
            assert caps.protocol_version == "deepx.v1"
    finally:
        assert served.stop() == 0


@pytest.mark.timeout(300)
def test_over_grpc_a_large_input_and_output_stream_in_bounded_chunks(tmp_path, client):
    """64 MiB in and out, past the 4 MiB message limit: streamed both ways (and over HTTP
    with binary data)."""
    import grpc
    from deepx_flow.contract import tensors
    from deepx_flow.contract.deepx.v1 import graphs_pb2, graphs_pb2_grpc, tensor_pb2
    spec = {"deepx": 1, "inputs": {"x": {"shape": [4096, 4096], "dtype": "float32"}},
            "nodes": [{"id": "y", "op": "mul", "args": ["x", 2.0]}], "outputs": ["y"]}
    x = np.random.default_rng(5).standard_normal((4096, 4096)).astype(np.float32)
    assert x.nbytes == 64 << 20
    served = Served(tmp_path)
    try:
        with grpc.insecure_channel(served.grpc) as channel:
            stub = graphs_pb2_grpc.GraphServiceStub(channel)
            caps = stub.GetCapabilities(graphs_pb2.GetCapabilitiesRequest())
            assert caps.limits.max_message_bytes == 4 << 20
            header = graphs_pb2.ExecuteGraphHeader(
                graph_json=json.dumps(spec), inputs=[tensors.to_message("x", x, 0)])
            assert header.inputs[0].streamed

            def requests():
                yield graphs_pb2.ExecuteGraphRequest(header=header)
                for index, offset, data in tensors.chunks(0, tensors.to_raw(x),
                                                          caps.limits.max_chunk_bytes):
                    yield graphs_pb2.ExecuteGraphRequest(input_chunk=tensor_pb2.TensorChunk(
                        tensor=index, offset=offset, data=bytes(data)))
            answers = list(stub.ExecuteGraph(requests()))
            operation = answers[0].operation
            assert operation.state == "succeeded", operation.error
            [y] = operation.outputs
            assert y.streamed and not y.raw_contents
            assert all(len(a.output_chunk.data) <= caps.limits.max_chunk_bytes
                       for a in answers[1:])
            assembler = tensors.Assembler({0: ("y", x.nbytes)})
            for a in answers[1:]:
                assembler.add(a.output_chunk.tensor, a.output_chunk.offset,
                              a.output_chunk.data)
            got = tensors.from_message(y, assembler.finish()[0])
            np.testing.assert_array_equal(got, x * np.float32(2.0))
            # its run, in the catalog
            from deepx_flow.contract.deepx.v1 import catalog_pb2, catalog_pb2_grpc
            catalog = catalog_pb2_grpc.CatalogServiceStub(channel)
            run = catalog.GetRun(catalog_pb2.GetRunRequest(id=operation.run_id))
            assert run.status == "succeeded" and run.tasks >= 1
            # how far it got (all of it) and its page on the dashboard
            assert (operation.progress.tasks_done, operation.progress.tasks_total) == \
                (run.tasks, run.tasks)
            assert operation.dashboard.endswith(f"/run?id={operation.run_id}")
            newest = catalog.ListRuns(catalog_pb2.ListRunsRequest(limit=1)).runs
            assert [r.id for r in newest] == [operation.run_id]
            # asked again by id: the same outputs
            again = list(stub.GetOperation(graphs_pb2.GetOperationRequest(id=operation.id)))
            assert again[0].operation.outputs == operation.outputs
            with pytest.raises(grpc.RpcError) as err:
                list(stub.GetOperation(graphs_pb2.GetOperationRequest(id="nope")))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            # (the error's kind in the trailing metadata, as HTTP's "kind")
            assert ("deepx-error-kind", "NotFound") in err.value.trailing_metadata()
            huge = graphs_pb2.ExecuteGraphHeader(graph_json=json.dumps(spec), inputs=[
                tensor_pb2.Tensor(name="x", datatype="FP64", shape=[1 << 40], streamed=True)])
            with pytest.raises(grpc.RpcError) as err:
                list(stub.ExecuteGraph(iter([graphs_pb2.ExecuteGraphRequest(header=huge)])))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ("deepx-error-kind", "TooLarge") in err.value.trailing_metadata()
            by_reference = graphs_pb2.ExecuteGraphHeader(
                graph_json=json.dumps(spec), inputs=[tensors.to_message("x", x, 0)],
                outputs=[tensor_pb2.Tensor(name="y", reference=tensor_pb2.TensorReference(
                    zarr_uri=str(tmp_path / "y.zarr")))])
            with pytest.raises(grpc.RpcError) as err:
                list(stub.ExecuteGraph(iter([graphs_pb2.ExecuteGraphRequest(
                    header=by_reference)])))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not served yet" in err.value.details()
            # the same over HTTP, with binary tensors
            remote = dx.connect(served.url)
            got = remote.execute(spec, {"x": x})["outputs"]["y"]
            np.testing.assert_array_equal(got, x * np.float32(2.0))
            bad = graphs_pb2.ExecuteGraphHeader(graph_json="{", inputs=[])
            with pytest.raises(grpc.RpcError) as err:
                list(stub.ExecuteGraph(iter([graphs_pb2.ExecuteGraphRequest(header=bad)])))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not JSON" in err.value.details()
    finally:
        assert served.stop() == 0


@pytest.fixture
def tcp_client():
    """A cluster of this process reachable over TCP, so a served gateway runs on it
    (`--scheduler`) and this test can hang its tasks (faults)."""
    from distributed import Client, LocalCluster
    from tests.helpers import threaded_memory_off
    with threaded_memory_off(), LocalCluster(n_workers=2, threads_per_worker=1,
                                             processes=False, protocol="tcp",
                                             dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as c:
        yield c


def _execute(url, operation_id, wait, timeout=120):
    x = np.arange(15, dtype=np.float64).reshape(5, 3) / 7
    return httpx.post(url + "/v1/graphs:execute", timeout=timeout, json={
        "graph": SPEC, "operation_id": operation_id, "wait_seconds": wait,
        "inputs": [{"name": "x", "shape": [5, 3], "datatype": "FP64",
                    "data": x.ravel().tolist()}]}), np.tanh(x).max(axis=1)


@pytest.mark.timeout(300)
def test_a_client_that_disconnects_mid_run_gets_the_results_by_its_operation_id(
        tmp_path, tcp_client):
    from deepx_flow.kernels.faults import Fault
    from tests.helpers import faults_on
    served = Served(tmp_path, "--scheduler", tcp_client.scheduler.address)
    try:
        with faults_on(tcp_client, Fault("hang")):
            with pytest.raises(httpx.ReadTimeout):  # waits for the end; gives up after 2 s
                _execute(served.url, "mine-1", None, timeout=2)
        # the hang is over: the operation ends without its client
        done = httpx.get(served.url + "/v1/operations/mine-1?wait_seconds=120",
                         timeout=180).json()
        assert done["state"] == "succeeded"
        _, want = _execute(served.url, "unused", 0)
        np.testing.assert_allclose(done["outputs"][0]["data"], want, rtol=4e-16, atol=0)
    finally:
        assert served.stop() == 0


@pytest.mark.timeout(300)
def test_after_a_sigkill_every_operation_is_final_and_finished_results_are_readable(
        tmp_path, tcp_client):
    from deepx_flow.kernels.faults import Fault
    from tests.helpers import faults_on
    served = Served(tmp_path, "--scheduler", tcp_client.scheduler.address)
    finished, want = _execute(served.url, "before", None)
    assert finished.json()["state"] == "succeeded"
    with faults_on(tcp_client, Fault("hang")):
        running, _ = _execute(served.url, "during", 0.5)
        assert running.json()["state"] == "running"
        served.proc.kill()  # SIGKILL: no cleanup of any kind
        served.proc.wait(60)
    again = Served(tmp_path, "--scheduler", tcp_client.scheduler.address)
    try:
        during = httpx.get(again.url + "/v1/operations/during", timeout=60).json()
        assert during["state"] == "interrupted" and "stopped before it finished" in \
            during["error"] and "outputs" not in during
        before = httpx.get(again.url + "/v1/operations/before", timeout=60).json()
        assert before["state"] == "succeeded"
        np.testing.assert_allclose(before["outputs"][0]["data"], want, rtol=4e-16, atol=0)
        assert not (tmp_path / "results" / "during").exists()
        listed = httpx.get(again.url + "/v1/runs?status=running", timeout=60).json()["runs"]
        assert listed == []  # the killed gateway's run too (meta/orphans.py)
    finally:
        assert again.stop() == 0


@pytest.mark.timeout(300)
def test_dx_connect_runs_sdk_graphs_remotely_with_dx_runs_bits(tmp_path, tcp_client,
                                                                monkeypatch):
    """On the same cluster and database as dx.run here (so the same plan): the same bits,
    NumPy operands the tensors carry included."""
    served = Served(tmp_path, "--scheduler", tcp_client.scheduler.address,
                    env={"DEEPX_DB_URL": None})
    try:
        remote = dx.connect(served.url)
        rng = np.random.default_rng(11)
        x = dx.input("x", (64, 32), "float32")
        w = rng.standard_normal((32, 16)).astype(np.float32)  # carried by the graph
        y = dx.softmax(dx.relu(x @ w) * 0.5, axis=1)
        s = y.sum(axis=0)
        data = rng.standard_normal((64, 32)).astype(np.float32)
        got = remote.run({"y": y, "s": s}, inputs={"x": data})
        want = dx.run({"y": y, "s": s}, inputs={"x": data}, client=tcp_client)
        for name in ("y", "s"):
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
        assert isinstance(remote.run(s, inputs={"x": data}), np.ndarray)
        # a run longer than one wait: asked for again by its id until it ends
        from deepx_flow.gateway import client as gateway_client
        from deepx_flow.kernels.faults import Fault
        from tests.helpers import faults_on
        import concurrent.futures
        monkeypatch.setattr(gateway_client, "POLL_SECONDS", 0.5)
        polls = []
        asked = remote.operation
        monkeypatch.setattr(remote, "operation", lambda *a: polls.append(a) or asked(*a))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with faults_on(tcp_client, Fault("hang")):  # until the block ends, 3 s on
                pending = pool.submit(remote.run, s, inputs={"x": data})
                time.sleep(3.0)
            slow = pending.result(timeout=120)
        np.testing.assert_array_equal(slow, want["s"])
        assert len(polls) >= 2  # it waited half a second at a time, by id
        ops = httpx.get(served.url + "/v1/runs?limit=1", timeout=60).json()["runs"]
        assert ops[0]["status"] == "succeeded"
        monkeypatch.undo()
        newest = remote.runs(limit=1)[0]
        with pytest.raises(dx.DeepxError, match="input 'x' .* was not given") as refused:
            remote.run(s)
        assert refused.value.kind == "InputError" and refused.value.status == 400
        assert remote.runs(limit=1) == [newest]  # refused before any run started
        # a client whose operator table differs is told what differs, at once
        from deepx_flow.gateway import capabilities
        ours = capabilities.operator_table()
        extra = {**ours[0], "name": "zeta"}
        changed = [{**o, "attributes": o["attributes"] + ["mode"]} if o["name"] == "conv"
                   else o for o in ours]
        monkeypatch.setattr(capabilities, "operator_table", lambda: changed + [extra])
        with pytest.raises(dx.DeepxError, match="missing zeta; different conv"):
            dx.connect(served.url)
        monkeypatch.undo()
    finally:
        assert served.stop() == 0
    with pytest.raises(dx.DeepxError, match="cannot reach the gateway"):
        dx.connect(served.url)


@pytest.mark.timeout(300)
def test_a_graceful_stop_interrupts_running_operations_and_grpc_cancels(tmp_path,
                                                                        tcp_client):
    import grpc
    from deepx_flow.contract.deepx.v1 import graphs_pb2, graphs_pb2_grpc
    from deepx_flow.kernels.faults import Fault
    from tests.helpers import faults_on
    served = Served(tmp_path, "--scheduler", tcp_client.scheduler.address)
    with faults_on(tcp_client, Fault("hang")):
        assert _execute(served.url, "by-grpc", 0)[0].json()["state"] == "running"
        with grpc.insecure_channel(served.grpc) as channel:
            stub = graphs_pb2_grpc.GraphServiceStub(channel)
            cancelled = stub.CancelOperation(graphs_pb2.CancelOperationRequest(id="by-grpc"))
        assert cancelled.state == "interrupted" and "cancelled" in cancelled.error
        assert _execute(served.url, "at-stop", 0)[0].json()["state"] == "running"
        began = time.monotonic()
        assert served.stop() == 0
        assert time.monotonic() - began < 50
    again = Served(tmp_path, "--scheduler", tcp_client.scheduler.address)
    try:
        at_stop = httpx.get(again.url + "/v1/operations/at-stop", timeout=60).json()
        assert at_stop["state"] == "interrupted" and "gateway stopped" in at_stop["error"]
    finally:
        assert again.stop() == 0


GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.yaml"))
# Each example graph's inputs and made shapes, scaled down to run in a test (the examples
# are up to 3.8 GiB); every other stated shape is dropped and inferred again.
SMALLER = {"attention": {"q": [2, 128, 16], "k": [2, 128, 16], "v": [2, 128, 16]},
           "column_stats": {"x": [3000, 16]}, "elementwise_chain": {"x": [500, 64]},
           "larger_than_memory": {"data": [4000, 16]},
           "layout": {"x": [256, 128], "y": [128, 256], "blocks": [128, -1, 64]},
           "mlp_forward": {"x": [300, 512]}, "reductions": {}}


def _scaled(path):
    import yaml
    from deepx_flow.ops import OPS
    doc = yaml.safe_load(path.read_text())
    smaller = SMALLER[path.stem]
    for name, fields in (doc.get("inputs") or {}).items():
        fields["shape"] = smaller.get(name, fields["shape"])
    for node in doc["nodes"]:
        if "shape" in OPS[node["op"]].declared:
            node["shape"] = smaller.get(node["id"], node["shape"])
        else:
            node.pop("shape", None)
    return doc


def _inputs_of(graph, seed):
    rng = np.random.default_rng(seed)
    arrays = {}
    for node in graph.inputs:
        if np.dtype(node.dtype).kind in "iu":
            arrays[node.id] = rng.integers(-50, 50, node.shape).astype(node.dtype)
        else:
            arrays[node.id] = rng.standard_normal(node.shape).astype(node.dtype)
    return arrays


def test_every_example_graph_is_scaled_here():
    assert sorted(SMALLER) == sorted(p.stem for p in GRAPHS)


@pytest.mark.timeout(600)
def test_every_example_graph_over_http_and_grpc_gives_dx_runs_bits(tmp_path, tcp_client):
    """Analyzed at full size; executed scaled down, over HTTP (dx.connect) and over gRPC,
    on the cluster and database dx.run uses here (so the same plan): the same bits."""
    import grpc
    import yaml
    from deepx_flow.contract import streams
    from deepx_flow.contract.deepx.v1 import graphs_pb2_grpc
    served = Served(tmp_path, "--scheduler", tcp_client.scheduler.address,
                    env={"DEEPX_DB_URL": None})
    try:
        remote = dx.connect(served.url)
        with grpc.insecure_channel(served.grpc) as channel:
            stub = graphs_pb2_grpc.GraphServiceStub(channel)
            for seed, path in enumerate(GRAPHS):
                full = yaml.safe_load(path.read_text())
                analyzed = httpx.post(served.url + "/v1/graphs:analyze", json={"graph": full},
                                      timeout=120).json()
                graph = graph_of(full, 100_000)
                assert [o["name"] for o in analyzed["outputs"]] == \
                    [name for name, _ in graph.outputs], path.stem
                doc = _scaled(path)
                graph = graph_of(doc, 100_000)
                arrays = _inputs_of(graph, seed)
                want = dx.run(graph, inputs=arrays, client=tcp_client)
                over_http = remote.execute(doc, arrays)
                assert over_http["state"] == "succeeded", (path.stem, over_http.get("error"))
                operation, over_grpc = streams.operation_outputs(stub.ExecuteGraph(
                    streams.execute_requests(json.dumps(doc), arrays)))
                assert operation.state == "succeeded", (path.stem, operation.error)
                for name, _ in graph.outputs:
                    for got in (over_http["outputs"][name], over_grpc[name]):
                        assert got.dtype == want[name].dtype and got.shape == want[name].shape
                        np.testing.assert_array_equal(got, want[name],
                                                      err_msg=f"{path.stem}: {name}")
    finally:
        assert served.stop() == 0


def test_an_answers_tensors_are_inline_only_while_together_they_fit_one_message():
    """Two outputs of 3 MB: each under the 4 MiB limit, together over it; the first is
    inline, the second streamed, and no message passes the limit."""
    from deepx_flow.gateway.capabilities import Limits
    from deepx_flow.gateway.grpc_server import _operation_messages
    a = np.arange(750_000, dtype=np.float32)
    answer = {"operation": "o", "state": "succeeded", "kind": "execute", "run_id": "r",
              "outputs": {"a": a, "b": a[::-1].copy()}}
    limits = Limits()
    messages = list(_operation_messages(answer, limits))
    assert all(m.ByteSize() <= limits.max_message_bytes for m in messages)
    a_head, b_head = messages[0].operation.outputs
    assert (a_head.streamed, b_head.streamed) == (False, True)
    assert np.frombuffer(a_head.raw_contents, "<f4").tolist() == a.tolist()
    streamed = b"".join(m.output_chunk.data for m in messages[1:])
    assert {m.output_chunk.tensor for m in messages[1:]} == {1}
    assert np.frombuffer(streamed, "<f4").tolist() == a[::-1].tolist()
