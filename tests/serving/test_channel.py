"""A replica's own connection for batches (`serving/channel.py`): every dtype and shape
crosses it as sent, the replica's errors come back as their own kind, only the holder of
the token is answered, a replica whose worker closed closes its connection, and replicas
on a plain-TCP cluster take their batches over it from the event loop of the requests
(and as actor calls from a caller with no loop)."""

import asyncio
import socket
import threading

import ml_dtypes
import numpy as np
import pytest

from deepx_flow.errors import ExecutionError, InputError
from deepx_flow.serving.channel import BatchChannel, BatchServer, ChannelLost

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", ml_dtypes.bfloat16]


def _on_a_loop(test):
    """Run `test()`, a coroutine function, on an event loop of its own, of the kind the
    gateway runs (uvloop's, where it is installed)."""
    from deepx_flow.gateway.serve import run_event_loop
    return run_event_loop(asyncio.wait_for(test(), 120))


async def _server(infer, alive=lambda: True):
    server = BatchServer("127.0.0.1", infer, alive)
    return server, await BatchChannel.open(server.address, server.token)


def test_every_dtype_and_shape_crosses_as_sent():
    seen = []

    def infer(arrays, outputs):
        seen.append(outputs)
        return {name: a.copy() for name, a in arrays.items()}

    async def test():
        server, channel = await _server(infer)
        try:
            rng = np.random.default_rng(0)
            for dtype in DTYPES:
                for shape in [(), (0,), (3, 0, 2), (5,), (2, 3, 4), (300, 1000)]:
                    a = (rng.standard_normal(shape) * 100).astype(dtype)
                    b = np.asfortranarray(rng.integers(0, 2, (3, 2))).astype(dtype)  # F
                    got = await channel.run({"a": a, "b": b[::2]}, ["y"])
                    for name, want in (("a", a), ("b", b[::2])):
                        assert got[name].dtype == want.dtype
                        assert got[name].shape == want.shape
                        assert got[name].tobytes() == np.ascontiguousarray(want).tobytes()
            assert seen[-1] == ["y"] and await channel.run({}, None) == {}
            assert seen[-1] is None
        finally:
            channel.close()
            server.stop()
    _on_a_loop(test)


def test_the_replicas_errors_come_back_as_their_kind():
    def infer(arrays, outputs):
        if "bad" in arrays:
            raise InputError("model 'm': input 'bad' has shape [2], not [3]")
        return {"y": np.full(1, np.nan)}

    def broken(arrays, outputs):
        raise KeyError("nothing")

    async def test():
        for fn, kind, says in ((infer, InputError, "input 'bad' has shape"),
                               (broken, ExecutionError, "KeyError: 'nothing'")):
            server, channel = await _server(fn)
            try:
                with pytest.raises(kind, match=says):
                    await channel.run({"bad": np.ones(2)}, None)
                if fn is infer:  # and the connection serves on
                    assert np.isnan((await channel.run({"x": np.ones(1)}, None))["y"]).all()
            finally:
                channel.close()
                server.stop()
    _on_a_loop(test)


def test_only_the_token_holder_is_answered():
    calls = []
    server = BatchServer("127.0.0.1", lambda a, o: calls.append(1) or {})
    try:
        async def wrong_token():
            channel = await BatchChannel.open(server.address, b"\0" * 32)
            try:
                await channel.run({"x": np.ones(2)}, None)
            finally:
                channel.close()
        with pytest.raises(ChannelLost):
            _on_a_loop(wrong_token)
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

    async def test():
        server, channel = await _server(lambda a, o: {"y": a["x"] * 2}, alive.is_set)
        try:
            got = await channel.run({"x": np.ones(2)}, None)
            np.testing.assert_array_equal(got["y"], [2, 2])
            alive.clear()
            with pytest.raises(ChannelLost):
                await channel.run({"x": np.ones(2)}, None)
            with pytest.raises((OSError, ChannelLost)):  # and serves no new connection
                await (await BatchChannel.open(server.address, server.token, 5)).run({},
                                                                                    None)
        finally:
            channel.close()
            server.stop()
    _on_a_loop(test)


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
            replicas = models._entries["mlp"].replicas
            assert all(p[3] is not None for p in replicas._placed)  # an endpoint each
            rng = np.random.default_rng(2)
            xs = [rng.standard_normal((k, 784)).astype(np.float32) for k in (1, 3, 2, 5)]

            async def requests():
                loop = asyncio.get_running_loop()
                for _ in range(3):  # (over the connections, both replicas busy)
                    pending = [models.submit("mlp", "", {"x": x}, loop=loop)[1] for x in xs]
                    for x, got in zip(xs, await asyncio.gather(*pending)):
                        close(got["probs"], runtime(path, {"x": x})["probs"])
                    channels = [held[1] for held in replicas._channels.values()]
                    assert len(channels) == 2 and all(c is not None for c in channels)
                with pytest.raises(InputError, match="has shape"):
                    await replicas.run_async(0, {"x": np.ones((1, 5), np.float32)}, None)

            _on_a_loop(requests)
            # from no loop: as actor calls
            close(models.infer("mlp", "", {"x": xs[1]})[1]["probs"],
                  runtime(path, {"x": xs[1]})["probs"])
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
        async def test():
            gateway = await BatchChannel.open(server.address, server.token)
            assert await gateway.run({}, None) == {}
            with pytest.raises((OSError, ChannelLost)):  # no second connection is taken
                await (await BatchChannel.open(server.address, server.token, 5)).run(
                    {}, None)
            assert (await gateway.run({"x": np.ones(1)}, None)).keys() == set()  # the
            gateway.close()  # first serves on
        _on_a_loop(test)
    finally:
        server.stop(connection=True)


def test_a_batch_cancelled_mid_frame_breaks_its_connection_for_good():
    """A batch whose task is cancelled after it was sent leaves its answer on the wire:
    the connection is closed and every later batch on it is refused (ChannelLost: the
    replica is placed again), never given the earlier batch's answer."""
    import time

    def slow(arrays, outputs):
        time.sleep(0.3)
        return {"y": arrays["x"] + 1}

    async def test():
        server, channel = await _server(slow)
        try:
            sent = asyncio.create_task(channel.run({"x": np.zeros(2)}, None))
            await asyncio.sleep(0.05)
            sent.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sent
            assert channel.broken
            with pytest.raises(ChannelLost):
                await channel.run({"x": np.ones(2)}, None)
        finally:
            channel.close()
            server.stop()
    _on_a_loop(test)
