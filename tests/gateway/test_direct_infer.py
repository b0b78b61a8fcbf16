"""gateway/direct_infer.py: small infer requests answered by the HTTP protocol itself (no
ASGI cycle), exactly as the ASGI way answers them; everything it does not take goes the
ASGI way and is answered there; pipelined requests are answered in order; a request that
asks it, or a stopping server, closes the connection. Served by uvicorn on loopback in this
process; the requests that reached the ASGI app are recorded by a wrapper around it."""

import json
import socket
import threading
import time
import types

import numpy as np
import pytest
import uvicorn

from deepx_flow.gateway.auth import Credentials
from deepx_flow.gateway.capabilities import Limits
from deepx_flow.gateway.direct_infer import direct_infer_http
from deepx_flow.gateway.http_app import make_app
from deepx_flow.gateway.http_bodies import SMALL_BYTES
from deepx_flow.gateway.service import Gateway
from deepx_flow.meta import open_db
from deepx_flow.runtime.run import cluster_spec
from deepx_flow.serving.repository import ModelRepository
from tests.onnx.test_onnx_import import close, mlp_model, runtime

ON_LOOP = """
max_batch_size: 64
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
TOKEN = "a-token-for-the-tests"


class _Server:
    """deepx_flow's HTTP app with the direct protocol, on a loopback port, in a thread."""

    def __init__(self, tmp_path, creds=None, **config):
        root = tmp_path / "models"
        for name, classes in (("mlp", 10), ("wide", 20000)):  # (wide: a 160 KB answer)
            (root / name / "1").mkdir(parents=True)
            mlp_model(root / name / "1" / "model.onnx", features=16, hidden=8,
                      classes=classes, seed=4)
            (root / name / "config.pbtxt").write_text(ON_LOOP)
        self.models = ModelRepository(root, cluster_spec(None, None))
        for name in ("mlp", "wide"):
            self.models.load(name)
        gateway = Gateway(None, open_db(), tmp_path / "results", Limits(), self.models)
        app = make_app(gateway, creds)
        self.through_asgi = []  # (method, path) of each request the ASGI app took

        async def recorded(scope, receive, send):
            if scope["type"] == "http":
                self.through_asgi.append((scope["method"], scope["path"]))
            await app(scope, receive, send)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.address = sock.getsockname()
        self.server = uvicorn.Server(uvicorn.Config(
            recorded, log_level="warning", lifespan="off",
            http=direct_infer_http(gateway, creds), **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "no server"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(60)
        self.models.stop()


@pytest.fixture
def served(tmp_path):
    server = _Server(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def _request(path: str, body: bytes, headers=(), method="POST", version="1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: x", f"Content-Length: {len(body)}",
             *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _answers(sock, n: int, timeout: float = 60) -> list:
    """The next `n` answers on `sock`: (status, headers by lower-case name, body) each."""
    sock.settimeout(timeout)
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            more = sock.recv(1 << 16)
            assert more, f"the connection closed after {len(out)} answers"
            data += more
        head, data = data.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = dict((k.lower(), v.strip()) for k, v in (x.split(":", 1) for x in lines))
        size = int(headers["content-length"])
        while len(data) < size:
            more = sock.recv(1 << 16)
            assert more, "the connection closed inside an answer"
            data += more
        out.append((int(status_line.split()[1]), headers, data[:size]))
        data = data[size:]
    return out


def _exchange(server, *requests) -> list:
    """The answers to `requests` sent together (pipelined) on one connection."""
    with socket.create_connection(server.address) as sock:
        sock.sendall(b"".join(requests))
        return _answers(sock, len(requests))


def _in_turn(server, *requests) -> list:
    """The answers to `requests` sent on one connection, each once the last is answered."""
    with socket.create_connection(server.address) as sock:
        out = []
        for request in requests:
            sock.sendall(request)
            out += _answers(sock, 1)
        return out


def _json_body(x, **extra) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}], **extra}).encode()


def _connections(server) -> list:
    return list(server.server.server_state.connections)


def _rows(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def _want(server, name, x):
    return runtime(str(server.models.root / name / "1" / "model.onnx"), {"x": x})


def test_small_requests_in_json_and_binary_are_answered_without_the_asgi_app(served):
    x = _rows(1)
    raw = x.tobytes()
    head = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    [(status, headers, body), (bstatus, bheaders, bbody)] = _in_turn(
        served, _request("/v2/models/mlp/infer", _json_body(x, id="one")),
        _request("/v2/models/mlp/versions/1/infer?ignored=1", head + raw,
                 [f"Inference-Header-Content-Length: {len(head)}",
                  "Content-Type: application/octet-stream"]))
    want = _want(served, "mlp", x)
    assert status == 200 and headers["content-type"] == "application/json", body
    answer = json.loads(body)
    assert answer["id"] == "one" and answer["model_name"] == "mlp"
    assert answer["model_version"] == "1"
    got = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
           for o in answer["outputs"]}
    for name in ("logits", "probs"):
        close(got[name], want[name])
    assert {"date", "server"} <= set(headers)  # (uvicorn's own default headers)
    assert bstatus == 200 and bheaders["content-type"] == "application/octet-stream"
    json_length = int(bheaders["inference-header-content-length"])
    listed = json.loads(bbody[:json_length])["outputs"]
    at = json_length
    for entry in listed:
        size = entry["parameters"]["binary_data_size"]
        close(np.frombuffer(bbody[at:at + size], np.float32).reshape(entry["shape"]),
              want[entry["name"]])
        at += size
    assert at == len(bbody)
    assert served.through_asgi == []


def test_bad_requests_get_the_same_answer_as_the_asgi_way(served):
    """Each bad request sent both ways (the path with an escaped letter goes the ASGI
    way): the same status and body."""
    x = _rows(1)
    cases = {
        "not JSON": b'{"inputs": [',
        "not an object": b"[1, 2]",
        "wrong shape": _json_body(_rows(1)[:, :5]),
        "wrong datatype": json.dumps({"inputs": [{"name": "x", "shape": [1, 16],
                                                  "datatype": "FP64",
                                                  "data": x.ravel().tolist()}]}).encode(),
        "unknown input": _json_body(x).replace(b'"name": "x"', b'"name": "y"'),
        "unknown field": _json_body(x, extra=1),
        "unknown output": _json_body(x, outputs=[{"name": "nope"}]),
        "too many rows": _json_body(_rows(65)),
    }
    for what, body in cases.items():
        [direct, asgi] = _in_turn(served, _request("/v2/models/mlp/infer", body),
                                   _request("/v2/models/ml%70/infer", body))
        assert direct[0] in (400, 413) and (direct[0], direct[2]) == (asgi[0], asgi[2]), \
            (what, direct, asgi)
    for path in ("/v2/models/nope/infer", "/v2/models/mlp/versions/7/infer"):
        [direct, asgi] = _in_turn(served, _request(path, _json_body(x)),
                                   _request(path.replace("/infer", "/inf%65r"),
                                            _json_body(x)))
        assert direct[0] == 404 and (direct[0], direct[2]) == (asgi[0], asgi[2])
    assert len(served.through_asgi) == len(cases) + 2  # (the escaped ones alone)
    # the model counted as failed each request that it checked and refused, both ways
    checked = {"wrong shape", "wrong datatype", "unknown input", "unknown output",
               "too many rows"}
    stats = served.models.statistics("mlp")[0]
    assert stats["inference_stats"]["fail"]["count"] == 2 * len(checked)


def test_what_the_protocol_does_not_take_goes_the_asgi_way_and_is_answered(served):
    x = _rows(1)
    body = _json_body(x)
    large = _rows(60, seed=1)
    spaced = _json_body(large) + b" " * SMALL_BYTES  # (a body over SMALL_BYTES)
    chunked = ("POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
               "Transfer-Encoding: chunked\r\n\r\n").encode() + \
        b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    answers = _exchange(served,
                        _request("/v2/models/mlp/infer", spaced),
                        chunked,
                        _request("/v2/models/mlp/infer", b"", method="GET"),
                        _request("/v2/health/ready", b"", method="GET"))
    assert [a[0] for a in answers] == [200, 200, 405, 200], answers
    close(np.array(json.loads(answers[0][2])["outputs"][0]["data"], np.float32)
          .reshape(60, 10), _want(served, "mlp", large)["logits"])
    close(np.array(json.loads(answers[1][2])["outputs"][0]["data"], np.float32)
          .reshape(1, 10), _want(served, "mlp", x)["logits"])
    assert answers[2][1]["allow"] == "POST"
    assert [p for _, p in served.through_asgi] == ["/v2/models/mlp/infer"] * 3 + \
        ["/v2/health/ready"]
    # Expect: 100-continue: the ASGI way says continue, then answers
    with socket.create_connection(served.address) as sock:
        sock.sendall(_request("/v2/models/mlp/infer", b"", ["Expect: 100-continue"])
                     .replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)))
        sock.settimeout(60)
        assert sock.recv(1 << 16).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        [(status, _, answer)] = _answers(sock, 1)
    assert status == 200 and len(served.through_asgi) == 5


def test_pipelined_requests_are_answered_in_order_on_both_ways(served):
    xs = _rows(6, seed=2)
    requests = []
    for i, x in enumerate(xs):
        path = "/v2/models/mlp/infer" if i % 2 == 0 else "/v2/models/%6Dlp/infer"
        requests.append(_request(path, _json_body(x[None], id=str(i))))
    requests.insert(3, _request("/v2/health/live", b"", method="GET"))
    answers = _exchange(served, *requests)
    assert answers[3][0] == 200 and json.loads(answers[3][2]) == {"live": True}
    del answers[3]
    want = _want(served, "mlp", xs)["logits"]
    for i, (status, _, body) in enumerate(answers):
        answer = json.loads(body)
        assert status == 200 and answer["id"] == str(i)
        close(np.array(answer["outputs"][0]["data"], np.float32), want[i])


def test_a_large_answer_is_encoded_off_the_event_loop_and_whole(served):
    x = _rows(2, seed=3)
    [(status, headers, body)] = _exchange(served, _request("/v2/models/wide/infer",
                                                           _json_body(x)))
    assert status == 200 and len(body) > SMALL_BYTES
    got = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
           for o in json.loads(body)["outputs"]}
    want = _want(served, "wide", x)
    close(got["logits"], want["logits"])
    close(got["probs"], want["probs"])
    assert served.through_asgi == []


@pytest.mark.parametrize("how", ["connection: close", "HTTP/1.0"])
def test_a_request_that_asks_it_closes_the_connection_after_its_answer(served, how):
    x = _rows(1)
    request = _request("/v2/models/mlp/infer", _json_body(x),
                       ["Connection: close"] if how == "connection: close" else [],
                       version="1.0" if how == "HTTP/1.0" else "1.1")
    with socket.create_connection(served.address) as sock:
        sock.sendall(request)
        [(status, headers, _)] = _answers(sock, 1)
        assert status == 200 and headers["connection"] == "close"
        assert sock.recv(1 << 16) == b""  # (closed by the server)
    assert served.through_asgi == []


def test_a_client_gone_before_its_answer_leaves_the_server_answering_others(served):
    x = _rows(1)
    for _ in range(20):  # (gone at once: the answer finds the connection closed)
        sock = socket.create_connection(served.address)
        sock.sendall(_request("/v2/models/mlp/infer", _json_body(x)))
        sock.close()
    [(status, _, body)] = _exchange(served, _request("/v2/models/mlp/infer", _json_body(x)))
    assert status == 200
    close(np.array(json.loads(body)["outputs"][0]["data"], np.float32),
          _want(served, "mlp", x)["logits"][0])


def test_with_credentials_only_allowed_requests_are_answered_and_the_rest_refused(tmp_path):
    server = _Server(tmp_path, Credentials(token=TOKEN))
    try:
        x = _rows(1)
        body = _json_body(x)
        answers = _in_turn(server, _request("/v2/models/mlp/infer", body),
                            _request("/v2/models/mlp/infer", body,
                                     ["Authorization: Bearer wrong"]),
                            _request("/v2/models/mlp/infer", body,
                                     [f"Authorization: Bearer {TOKEN}"]))
        assert [a[0] for a in answers] == [401, 401, 200]
        assert "unauthenticated" in json.loads(answers[0][2])["error"]
        assert len(server.through_asgi) == 2  # (the refused ones; the allowed one direct)
    finally:
        server.stop()



@pytest.mark.parametrize("first", ["unknown model", "not JSON"])
def test_a_request_pipelined_behind_a_refused_one_is_answered_before_keep_alive_ends(
        tmp_path, first):
    """The refusal is answered after the parser's callbacks: the next request, already in
    the same packet, waits behind it as uvicorn makes it wait, and the keep-alive timer
    (here 0 s: it ends the connection at the loop's next turn) starts only once both are
    answered."""
    server = _Server(tmp_path, timeout_keep_alive=0)
    try:
        x = _rows(1)
        refused = _request("/v2/models/nope/infer", _json_body(x)) if first == "unknown model" \
            else _request("/v2/models/mlp/infer", b"[1")
        for _ in range(5):
            answers = _exchange(server, refused, _request("/v2/models/mlp/infer",
                                                          _json_body(x, id="second")))
            assert [a[0] for a in answers] == [404 if first == "unknown model" else 400, 200]
            assert json.loads(answers[1][2])["id"] == "second"
    finally:
        server.stop()


def test_a_client_that_does_not_read_its_answers_holds_little_of_the_servers_memory(served):
    """Requests for a large answer (about 0.8 MB of JSON each), each sent once the last is
    answered (so none is pipelined) by a client that reads nothing: once the connection's
    write buffer is full, the next request goes the ASGI way, which waits for the client to
    read before answering, and the server reads no more meanwhile. It holds a few answers,
    not one per request."""
    request = _request("/v2/models/wide/infer", _json_body(_rows(1)))
    state = served.server.server_state
    most = 0
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(served.address)
        sock.settimeout(0.5)
        deadline = time.monotonic() + 6
        for _ in range(60):
            answered = state.total_requests
            try:
                sock.sendall(request)
            except socket.timeout:  # (the server reads no more: the test is done)
                break
            while state.total_requests == answered and time.monotonic() < deadline:
                time.sleep(0.005)
            most = max([most] + [c.transport.get_write_buffer_size()
                                 for c in _connections(served)])
            if time.monotonic() >= deadline:
                break
    assert state.total_requests >= 3, "too few answered for the buffer to fill"
    assert most < 16 << 20, f"the server held {most:,} bytes for one connection"


def test_a_body_in_pieces_is_gathered_whatever_uvicorns_high_water_mark(served, monkeypatch):
    """uvicorn pauses reading a body past its HIGH_WATER_LIMIT until the app reads it; a
    direct call is never paused (nothing would resume it before the body's end)."""
    from uvicorn.protocols.http import httptools_impl
    monkeypatch.setattr(httptools_impl, "HIGH_WATER_LIMIT", 1000)
    x = _rows(40, seed=5)
    request = _request("/v2/models/mlp/infer", _json_body(x))
    assert len(request) < SMALL_BYTES
    with socket.create_connection(served.address) as sock:
        for start in range(0, len(request), 4000):
            sock.sendall(request[start:start + 4000])
            time.sleep(0.02)
        [(status, _, body)] = _answers(sock, 1)
    assert status == 200
    close(np.array(json.loads(body)["outputs"][0]["data"], np.float32).reshape(40, 10),
          _want(served, "mlp", x)["logits"])
    assert served.through_asgi == []
