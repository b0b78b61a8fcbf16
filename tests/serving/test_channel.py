"""A replica's own connection for batches (`serving/channel.py`): every dtype and shape
crosses it as sent, the replica's errors come back as their own kind, only the holder of
the token is answered, a replica whose worker closed closes its connection, and replicas
on a plain-TCP cluster take their batches over it."""

import socket
import threading

import ml_dtypes
import numpy as np
import pytest

from deepx_flow.errors import ExecutionError, InputError
from deepx_flow.serving.channel import BatchChannel, BatchServer, ChannelLost

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", ml_dtypes.bfloat16]


def _server(infer, alive=lambda: True):
    server = BatchServer("127.0.0.1", infer, alive)
    return server, BatchChannel(server.address, server.token)


def test_every_dtype_and_shape_crosses_as_sent():
    seen = []

    def infer(arrays, outputs):
        seen.append(outputs)
        return {name: a.copy() for name, a in arrays.items()}

    server, channel = _server(infer)
    try:
        rng = np.random.default_rng(0)
        for dtype in DTYPES:
            for shape in [(), (0,), (3, 0, 2), (5,), (2, 3, 4)]:
                a = (rng.standard_normal(shape) * 100).astype(dtype)
                b = np.asfortranarray(rng.integers(0, 2, (3, 2))).astype(dtype)  # (F order)
                got = channel.run({"a": a, "b": b[::2]}, ["y"])
                for name, want in (("a", a), ("b", b[::2])):
                    assert got[name].dtype == want.dtype and got[name].shape == want.shape
                    assert got[name].tobytes() == np.ascontiguousarray(want).tobytes()
        assert seen[-1] == ["y"] and channel.run({}, None) == {} and seen[-1] is None
    finally:
        channel.close()
        server.stop()


def test_the_replicas_errors_come_back_as_their_kind():
    def infer(arrays, outputs):
        if "bad" in arrays:
            raise InputError("model 'm': input 'bad' has shape [2], not [3]")
        return {"y": np.full(1, np.nan)}

    def broken(arrays, outputs):
        raise KeyError("nothing")

    for fn, kind, says in ((infer, InputError, "input 'bad' has shape"),
                           (broken, ExecutionError, "KeyError: 'nothing'")):
        server, channel = _server(fn)
        try:
            with pytest.raises(kind, match=says):
                channel.run({"bad": np.ones(2)}, None)
            if fn is infer:  # and the connection serves on
                assert np.isnan(channel.run({"x": np.ones(1)}, None)["y"]).all()
        finally:
            channel.close()
            server.stop()


def test_only_the_token_holder_is_answered():
    calls = []
    server = BatchServer("127.0.0.1", lambda a, o: calls.append(1) or {})
    try:
        with pytest.raises(ChannelLost):
            BatchChannel(server.address, b"\0" * 32).run({"x": np.ones(2)}, None)
        with socket.create_connection(server.address) as raw:  # a frame, no token
            raw.sendall(b"\0" * 64)
            raw.settimeout(30)
            try:
                assert raw.recv(1) == b""  # closed, unanswered
            except ConnectionResetError:
                pass  # (closed with bytes unread: reset, unanswered)
        assert calls == []
    finally:
        server.stop()


def test_a_replica_whose_worker_closed_closes_its_connection():
    alive = threading.Event()
    alive.set()
    server, channel = _server(lambda a, o: {"y": a["x"] * 2}, alive.is_set)
    try:
        np.testing.assert_array_equal(channel.run({"x": np.ones(2)}, None)["y"], [2, 2])
        alive.clear()
        with pytest.raises(ChannelLost):
            channel.run({"x": np.ones(2)}, None)
        with pytest.raises((OSError, ChannelLost)):  # and serves no new connection
            BatchChannel(server.address, server.token, timeout=5).run({}, None)
    finally:
        channel.close()
        server.stop()


@pytest.mark.timeout(300)
def test_replicas_on_a_tcp_cluster_take_their_batches_over_their_connection(tmp_path):
    from distributed import Client, LocalCluster

    from deepx_flow.runtime.run import cluster_spec
    from deepx_flow.serving.repository import ModelRepository
    from tests.onnx.test_onnx_import import close, mlp_model
    from tests.serving.test_oip import runtime
    (tmp_path / "models" / "mlp" / "1").mkdir(parents=True)
    path = mlp_model(tmp_path / "models" / "mlp" / "1" / "model.onnx", seed=4)
    (tmp_path / "models" / "mlp" / "config.pbtxt").write_text(
        "instance_group [ { count: 2, kind: KIND_AUTO } ]\n")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol="tcp",
                      dashboard_address=":0") as local, \
            Client(local, set_as_default=False) as client:
        models = ModelRepository(tmp_path / "models", cluster_spec(None, client), client)
        try:
            models.load("mlp")
            placed = models._entries["mlp"].replicas._placed
            assert all(p[3] is not None for p in placed)  # a channel each
            x = np.random.default_rng(2).standard_normal((3, 784)).astype(np.float32)
            for _ in range(3):
                close(models.infer("mlp", "", {"x": x})[1]["probs"],
                      runtime(path, {"x": x})["probs"])
            with pytest.raises(InputError, match="has shape"):
                placed[0][3].run({"x": np.ones((1, 5), np.float32)}, None)
        finally:
            models.stop()


def test_a_frame_that_is_not_one_is_refused_whole():
    """Bytes past its arrays, a name twice, a header that is no object, a length past the
    limit: each a ValueError, never arrays read from the wrong bytes."""
    import json
    import struct

    from deepx_flow.serving import channel

    def frame(header, payload=b""):
        head = json.dumps(header).encode()
        return struct.pack("!QQ", len(head), len(payload)) + head + payload

    cases = [frame({"arrays": [["a", "float32", [1]]]}, b"\0" * 8),
             frame({"arrays": [["a", "float32", [1]], ["a", "float32", [1]]]}, b"\0" * 8),
             frame({"arrays": [["a", "float32", [2]]]}, b"\0" * 4),
             frame({"arrays": [["a", "float32", [-1]]]}), frame([1, 2]), frame({}),
             frame({"arrays": [["a", "nonsense", [1]]]}, b"\0" * 4),
             struct.pack("!QQ", 8, 1 << 62)]
    for sent in cases:
        left, right = socket.socketpair()
        with left, right:
            left.sendall(sent)
            left.shutdown(socket.SHUT_WR)
            with pytest.raises((ValueError, TypeError, ChannelLost)):
                channel._read_frame(right)
    left, right = socket.socketpair()  # and a good one reads as sent
    with left, right:
        left.sendall(frame({"arrays": [["a", "float32", [2]]], "outputs": None},
                           np.array([1.5, 2.5], "<f4").tobytes()))
        header, arrays = channel._read_frame(right)
    assert header == {"outputs": None}
    np.testing.assert_array_equal(arrays["a"], [1.5, 2.5])


def test_a_silent_connection_is_closed_and_the_gateways_is_the_only_one(monkeypatch):
    from deepx_flow.serving import channel
    monkeypatch.setattr(channel, "TOKEN_WAIT_S", 0.5)
    server = BatchServer("127.0.0.1", lambda a, o: {})
    try:
        with socket.create_connection(server.address) as idle:
            idle.settimeout(30)
            try:
                assert idle.recv(1) == b""  # closed after TOKEN_WAIT_S, unanswered
            except ConnectionResetError:
                pass
        gateway = BatchChannel(server.address, server.token)
        assert gateway.run({}, None) == {}
        with pytest.raises((OSError, ChannelLost)):  # no second connection is taken
            BatchChannel(server.address, server.token, timeout=5).run({}, None)
        assert gateway.run({"x": np.ones(1)}, None).keys() == set()  # the first serves on
        gateway.close()
    finally:
        server.stop(connection=True)
