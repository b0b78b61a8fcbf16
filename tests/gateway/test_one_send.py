"""gateway/one_send.py: what is written in one turn of the event loop leaves in one send,
in order; closing sends it, aborting drops it; uvicorn on it answers requests whole."""

import asyncio
import contextlib
import socket

import pytest

from deepx_flow.gateway.one_send import JOINED_BYTES, OneSendHttp, OneSendTransport


class _Server(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = OneSendTransport(transport)
        self.made.set_result(self.transport)


@contextlib.asynccontextmanager
async def _paired():
    """A OneSendTransport on a loopback connection, and the client's (blocking-free)
    socket; both closed after."""
    loop = asyncio.get_running_loop()
    protocol = _Server()
    protocol.made = loop.create_future()
    server = await loop.create_server(lambda: protocol, "127.0.0.1", 0)
    client = socket.create_connection(server.sockets[0].getsockname())
    try:
        client.setblocking(False)
        yield await asyncio.wait_for(protocol.made, 10), client
    finally:
        client.close()
        server.close()


def _received(client) -> bytes:
    try:
        return client.recv(1 << 20)
    except BlockingIOError:
        return b""


async def _all(client, n: int) -> bytes:
    got = b""
    for _ in range(1000):
        got += _received(client)
        if len(got) >= n:
            return got
        await asyncio.sleep(0.01)
    return got


def test_writes_of_one_turn_leave_together_after_it():
    async def main():
        async with _paired() as (transport, client):
            transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
            transport.write(memoryview(b"body"))
            transport.write(b"")
            assert transport.get_write_buffer_size() == 23
            await asyncio.sleep(0.05)  # (the loop turns: they are sent)
            assert await _all(client, 23) == b"HTTP/1.1 200 OK\r\n\r\nbody"
            assert transport.get_write_buffer_size() == 0
    asyncio.run(main())


def test_nothing_is_sent_before_the_turn_ends():
    async def main():
        async with _paired() as (transport, client):
            transport.write(b"head")
            transport.write(b"tail")
            # (on loopback a send is in the peer's buffer when it returns)
            await asyncio.get_running_loop().run_in_executor(None, lambda: None)
            assert await _all(client, 8) == b"headtail"
            transport.write(b"x")
            assert _received(client) == b""  # still held: this turn has not ended
    asyncio.run(main())


def test_close_sends_what_is_held_and_abort_drops_it():
    async def main():
        async with _paired() as (transport, client):
            transport.write(b"last words")
            transport.close()
            assert transport.is_closing()
            assert await _all(client, 10) == b"last words"
        async with _paired() as (transport, client):
            transport.write(b"never")
            transport.abort()
            await asyncio.sleep(0.05)
            try:
                got = client.recv(100)  # (closed: nothing)
            except (ConnectionResetError, BlockingIOError):
                got = b""  # reset, or (raced) nothing yet
            assert got == b""
    asyncio.run(main())


def test_a_large_write_goes_at_once_after_what_is_held():
    async def main():
        async with _paired() as (transport, client):
            big = bytes(range(256)) * (JOINED_BYTES // 256)
            transport.write(b"head")
            transport.write(big)
            got = _received(client)  # (sent already: no turn of the loop needed)
            assert got and got == (b"head" + big)[:len(got)]
            got += await _all(client, 4 + len(big) - len(got))
            assert got == b"head" + big
    asyncio.run(main())


def test_a_write_after_close_is_dropped_on_the_gateways_loop_too():
    """uvloop's transport raises for a write once closed (asyncio's drops it): a large
    write, which goes to it at once, is dropped as a small one is."""
    from deepx_flow.gateway.serve import run_event_loop

    async def main():
        async with _paired() as (transport, client):
            transport.close()
            await asyncio.sleep(0.05)  # (closed, not only closing)
            transport.write(b"small")
            transport.write(bytes(JOINED_BYTES))
            await asyncio.sleep(0.05)
            assert client.recv(100) == b""  # (the server's end closed, nothing sent)
    run_event_loop(main())


class _Counted:
    """A transport that counts the writes made on it (the socket's sends)."""

    def __init__(self, transport, writes):
        self._transport, self.writes = transport, writes

    def write(self, data):
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name):
        return getattr(self._transport, name)


@pytest.mark.parametrize("loop", ["asyncio", "the gateway's"])
def test_uvicorn_on_it_answers_pipelined_and_streamed_responses_whole_in_one_send_each(loop):
    import uvicorn

    from deepx_flow.gateway.serve import run_event_loop

    writes = []

    class Counted(OneSendHttp):
        def connection_made(self, transport):
            super().connection_made(_Counted(transport, writes))

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = (await receive())["body"]
        if scope["path"] == "/stream":  # (no length: chunked, in three messages)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"a" * 5, body, b""):
                await send({"type": "http.response.body", "body": part,
                            "more_body": part != b""})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(app, http=Counted, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst"
                         b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nend")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200") and b"content-length: 5" in head
            assert await reader.readexactly(5) == b"first"
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert b"transfer-encoding: chunked" in head
            assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10) == \
                b"5\r\naaaaa\r\n3\r\nend\r\n0\r\n\r\n"
            writer.close()
            # the first answer, headers and body, left in one send (the second's parts
            # were sent from different turns of the loop, as the app sent them)
            assert writes[0].startswith(b"HTTP/1.1 200") and writes[0].endswith(b"first")
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)
    (asyncio.run if loop == "asyncio" else run_event_loop)(main())
