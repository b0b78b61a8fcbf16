"""uvicorn's HTTP/1.1 protocol (httptools), but writing each turn of the event loop's
bytes for a connection in one send.

An ASGI server writes a response as the app sends it: the status line and headers when the
app sends `http.response.start`, the body when it sends `http.response.body`. uvicorn makes
each a `transport.write`, and asyncio sends each at once (its sockets have TCP_NODELAY): two
system calls and two segments for every answer, and two wake-ups for the client reading it.
For a one-row inference that was a seventh of the event loop's time. Here writes are held
in the connection's buffer and sent together where the event loop next comes round
(`loop.call_soon`), which for an answer is right after its body: one send. A large write
(a body of binary tensors) goes at once after what is held, not copied to join it. Closing
sends what is held first; aborting drops it, as the transport's own buffer is dropped.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class OneSendHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol on an `OneSendTransport`; given to uvicorn as
    `Config(http=OneSendHttp)`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneSendTransport(transport))


JOINED_BYTES = 64 << 10  # a write at least this large is sent as it is


class OneSendTransport:
    """`transport`, but that what is written in one turn of the event loop goes out as one
    write. Everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport):
        self._transport = transport
        self._held: list[bytes] = []

    def write(self, data) -> None:
        if not data:
            return
        if len(data) >= JOINED_BYTES:
            self._send()
            if not self._transport.is_closing():  # (uvloop's raises once it is closed)
                self._transport.write(data)
            return
        if not self._held:
            asyncio.get_running_loop().call_soon(self._send)
        self._held.append(bytes(data))

    def writelines(self, list_of_data) -> None:
        for data in list_of_data:
            self.write(data)

    def _send(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._send()  # (the transport sends its buffer before it closes)
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


__all__ = ["OneSendHttp", "OneSendTransport"]
