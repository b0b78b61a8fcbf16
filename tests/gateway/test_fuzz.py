"""A hypothesis fuzz of request bodies: whatever a client sends, the gateway answers with a
status that says what is wrong (4xx, one message) or does what was asked, never a 500, and
keeps serving."""

import json
import threading
import time

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings, strategies as st

from deepx_flow.gateway.capabilities import Limits
from deepx_flow.gateway.http_app import make_app
from deepx_flow.gateway.service import Gateway
from deepx_flow.meta import open_db
from tests.helpers import free_port

SPEC = {"deepx": 1, "inputs": {"x": {"shape": [2, 2], "dtype": "float32"}},
        "nodes": [{"id": "y", "op": "neg", "args": ["x"]}], "outputs": ["y"]}
TENSOR = {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
SOURCE = {"deepx": 1, "nodes": [{"id": "a", "op": "arange", "shape": [6], "dtype": "float32",
                                 "attrs": {"start": 0.0, "step": 1.0}}], "outputs": ["a"]}
READER = {"deepx": 1, "inputs": {"made": {"shape": [6], "dtype": "float32"}},
          "nodes": [{"id": "y", "op": "neg", "args": ["made"]}], "outputs": ["y"]}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)


def _mutated(base: dict):
    """A valid request with one field replaced, removed or added."""
    return st.one_of(
        st.builds(lambda k, v: {**base, k: v}, st.sampled_from(sorted(base)), json_values),
        st.builds(lambda k: {f: v for f, v in base.items() if f != k},
                  st.sampled_from(sorted(base))),
        st.builds(lambda k, v: {**base, k: v}, st.text(max_size=8), json_values))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from distributed import Client, LocalCluster
    from tests.helpers import threaded_memory_off
    with threaded_memory_off(), LocalCluster(n_workers=1, threads_per_worker=1,
                                             processes=False) as cluster, \
            Client(cluster, set_as_default=False) as client:
        folder = tmp_path_factory.mktemp("fuzz")
        db = open_db(f"sqlite:///{folder / 'fuzz.db'}")  # its assets: this module's own
        gateway = Gateway(client, db, folder / "results", Limits(max_request_bytes=1 << 20))
        # an asset to materialize and read: "made", stored once
        gateway.assets.define("made", SOURCE)
        import asyncio
        assert asyncio.run(gateway.materialize("made", wait_seconds=60))["state"] == \
            "succeeded"
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(make_app(gateway), host="127.0.0.1",
                                               port=port, log_level="critical"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
        server.should_exit = True
        thread.join(30)


def _check(url, path, body: bytes):
    answer = httpx.post(url + path, content=body, timeout=60)
    assert answer.status_code in (200, 400, 404, 405, 413), (answer.status_code, answer.text)
    if answer.status_code != 200:
        message = answer.json()["error"]
        assert isinstance(message, str) and message and "Traceback" not in message
    assert httpx.get(url + "/v1/capabilities", timeout=60).status_code == 200


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.one_of(
    json_values,
    _mutated({"graph": SPEC, "inputs": [TENSOR], "wait_seconds": 30}),
    st.builds(lambda t: {"graph": SPEC, "inputs": [t]}, _mutated(TENSOR)),
    st.builds(lambda n: {"graph": {**SPEC, "nodes": [n]}, "inputs": [TENSOR]},
              _mutated(SPEC["nodes"][0]))))
def test_execute_answers_every_body_with_a_status(url, body):
    _check(url, "/v1/graphs:execute", json.dumps(body).encode())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(json_values, _mutated({"graph": SPEC}), st.binary(max_size=64)))
def test_analyze_answers_every_body_with_a_status(url, body):
    _check(url, "/v1/graphs:analyze",
           body if isinstance(body, bytes) else json.dumps(body).encode())


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(
    json_values,
    _mutated({"name": "fuzzed", "graph": READER, "dependencies": ["made"],
              "description": "d", "partitions": ["a", "b"], "partition_axis": 0,
              "checks": [{"kind": "in_range", "low": -10.0, "blocking": False}]}),
    st.builds(lambda c: {"name": "fuzzed", "graph": READER, "checks": [c]},
              _mutated({"kind": "shape", "shape": [6], "blocking": True}))))
def test_define_answers_every_body_with_a_status(url, body):
    _check(url, "/v1/assets:define", json.dumps(body).encode())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["made", "nope", "m%C3%A9", "made%2Fx"]),
       call=st.sampled_from([":read", ":materialize"]),
       body=st.one_of(json_values, _mutated({"slice": [[0, 3]], "version": "",
                                             "partition": "", "partitions": [],
                                             "force": False, "wait_seconds": 5})))
def test_materialize_and_read_answer_every_body_with_a_status(url, name, call, body):
    _check(url, f"/v1/assets/{name}{call}", json.dumps(body).encode())
