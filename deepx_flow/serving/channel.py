"""A replica's own connection for batches: the gateway sends each batch straight to the
worker holding the replica over a TCP connection of their own, not as a Dask actor call.

Why: an actor call crosses four threads and two event loops (the replica thread's, the
Dask client's I/O loop, the worker's loop, its actor thread, and back), each taking the
GIL from whoever holds it; in the gateway that is the event loop reading every request.
At 64 clients of the MLP a 0.4 ms batch took 5 ms there and back that way. Here the
gateway's event loop writes the batch and reads the answer when it comes, as it reads the
requests (a thread of the gateway's per replica, blocked on the socket, took the GIL back
from the loop at each call and made every request slower), and a thread of the replica
reads it, runs the model and writes the outputs.

The connection is opened with a token of 32 random bytes that the replica gave the
gateway through Dask: only who holds it is answered, one connection (the replica stops
listening once the gateway's is open), and a connection that does not give it within
TOKEN_WAIT_S is closed. Like Dask's own plain-TCP connections, this one is not encrypted:
a cluster whose Dask connections are not plain TCP (TLS, UCX) keeps the actor calls
(`Replicas`). Both ends use TCP keepalive and a user timeout (as Dask's connections do),
so a worker that vanishes fails its batch within about 30 s instead of holding it.

A frame is two unsigned 64-bit lengths (big-endian: the JSON header's and the bytes'
after it), the header, then each array's bytes, C order, in the order the header lists
them: {"arrays": [[name, dtype, shape], ...], "outputs": [names] or null} for a batch,
{"arrays": [...]} or {"error": [kind, message]} for its answer. No pickle: what a
connection carries is data, never code.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import socket
import struct
import sys
import threading

import numpy as np

from deepx_flow import errors
from deepx_flow.errors import DeepxError, ExecutionError

log = logging.getLogger(__name__)

_LENGTHS = struct.Struct("!QQ")
TOKEN_BYTES = 32
TOKEN_WAIT_S = 5.0
MAX_HEADER_BYTES = 1 << 20
MAX_FRAME_BYTES = 1 << 40  # (what a frame may say it carries: a corrupt length is refused)
JOINED_BYTES = 1 << 20  # a frame this small is written as one piece
KEEPALIVE_S, USER_TIMEOUT_S = 10, 30  # (Dask's `distributed.comm.timeouts.tcp` is 30 s)


def _kept_alive(sock: socket.socket) -> None:
    """TCP_NODELAY, and keepalive probes with a user timeout where the system has them:
    a peer gone without a word (its host down, the network cut) then fails the call."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", KEEPALIVE_S // 5),
                        ("TCP_KEEPCNT", 5), ("TCP_USER_TIMEOUT", USER_TIMEOUT_S * 1000)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class ChannelLost(ExecutionError):
    """The connection to a replica broke (its worker gone, or the replica stopped)."""


class BatchServer:
    """The replica's side: listens on `host` (its worker's), and answers each batch with
    `infer(arrays, outputs)`, one thread per connection (the gateway opens one per
    replica), while `alive()` (its worker is running): a batch that finds it closed closes
    the connection, as an actor call to a closed worker fails, and the gateway places the
    replica again."""

    def __init__(self, host: str, infer, alive=lambda: True):
        self.infer, self.alive = infer, alive
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._listener = socket.create_server(
            (host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.address = (host, self._listener.getsockname()[1])
        self._stopped, self._conn = False, None
        threading.Thread(target=self._accept, daemon=True,
                         name="deepx-replica-batches").start()

    def stop(self, connection: bool = False) -> None:
        """Take no more connections; and with `connection`, end the gateway's too."""
        self._stopped = True
        # (shut down, not only closed: a close alone leaves a blocked call waiting)
        for sock in [self._listener] + ([self._conn] if connection and self._conn else []):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stopped:
                    return  # (closed)
                continue  # (a connection aborted, or no descriptor left: the next)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="deepx-replica-batch").start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                _kept_alive(conn)
                conn.settimeout(TOKEN_WAIT_S)
                if not hmac.compare_digest(bytes(_read_exactly(conn, TOKEN_BYTES)),
                                           self.token):
                    return  # not the gateway: nothing is said to it
                conn.settimeout(None)
                self._conn = conn
                self.stop()  # the gateway's connection: no other is taken
                while True:
                    header, arrays = _read_frame(conn)
                    if not self.alive():
                        self.stop()
                        return
                    try:
                        outputs = self.infer(arrays, header.get("outputs"))
                    except DeepxError as err:
                        _write_frame(conn, {"error": [type(err).__name__, str(err),
                                                      getattr(err, "kind", None)]}, {})
                        continue
                    except Exception as err:  # a kernel's failure: said, with its kind
                        _write_frame(conn, {"error": ["ExecutionError",
                                                      f"{type(err).__name__}: {err}",
                                                      None]}, {})
                        continue
                    _write_frame(conn, {}, outputs)
            except (OSError, ChannelLost, ValueError, TypeError):
                return  # the gateway went away, was too slow, or sent what is no frame


class BatchChannel:
    """The gateway's side of one replica's connection, on the gateway's event loop: `await
    run(...)` sends a batch and gives its outputs (name -> array), raising the replica's
    DeepxError as its own kind, or ChannelLost where the connection broke. One batch at a
    time (a replica runs one). Open it with `await BatchChannel.open(address, token)`."""

    def __init__(self, reader, writer):
        self._reader, self._writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.broken = False  # a batch ended mid-frame: the connection is closed

    @classmethod
    async def open(cls, address: tuple, token: bytes, timeout: float = 30.0):
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), timeout)
        _kept_alive(writer.get_extra_info("socket"))
        writer.write(token)
        return cls(reader, writer)

    async def run(self, arrays: dict, outputs) -> dict:
        if self.broken:
            raise ChannelLost("the connection to the replica broke in an earlier batch")
        try:
            for part in _frame({"outputs": list(outputs) if outputs else None}, arrays):
                self._writer.write(part)
            await self._writer.drain()
            head_bytes, size = _LENGTHS.unpack(await self._reader.readexactly(_LENGTHS.size))
            _check_lengths(head_bytes, size)
            head = await self._reader.readexactly(head_bytes)
            header, results = _parsed(head, bytearray(await self._reader.readexactly(size)))
        except (OSError, asyncio.IncompleteReadError, ValueError, TypeError) as err:
            # (or it sent what is no frame)
            self._break()
            raise ChannelLost(f"the connection to the replica broke: {err}") from None
        except BaseException:  # (cancelled mid-frame: its answer must not be the next's)
            self._break()
            raise
        if "error" in header:
            name, message, kind = header["error"]
            cls = getattr(errors, name, None)
            if not (isinstance(cls, type) and issubclass(cls, DeepxError)):
                cls = ExecutionError
            err = cls(message)
            if kind is not None:
                err.kind = kind
            raise err
        return results

    def _break(self) -> None:
        self.broken = True
        self._writer.close()

    def close(self) -> None:
        """Close the connection; from any thread (on its loop, where that still runs)."""
        try:
            self.loop.call_soon_threadsafe(self._writer.close)
        except RuntimeError:  # (its loop has closed, and its connections with it)
            pass


def _frame(header: dict, arrays: dict) -> list:
    """The bytes of a frame of `header` and `arrays`, in parts (one, where the frame is at
    most JOINED_BYTES: one send): little-endian on the wire (each end's own order after),
    C order; a 0-d array stays."""
    blocks = [np.require(_little(a), requirements="C") for a in arrays.values()]
    header = {**header, "arrays": [[name, a.dtype.name, list(a.shape)]
                                   for name, a in zip(arrays, blocks)]}
    head = json.dumps(header).encode()
    size = sum(a.nbytes for a in blocks)
    parts = [_LENGTHS.pack(len(head), size) + head] + [
        memoryview(a.reshape(-1).view(np.uint8)) for a in blocks if a.nbytes]  # (bfloat16
    #                                                                have no buffer format)
    return [b"".join(parts)] if len(parts[0]) + size <= JOINED_BYTES else parts


def _write_frame(sock: socket.socket, header: dict, arrays: dict) -> None:
    for part in _frame(header, arrays):
        sock.sendall(part)


def _read_frame(sock: socket.socket) -> tuple[dict, dict]:
    head_bytes, size = _LENGTHS.unpack(_read_exactly(sock, _LENGTHS.size))
    _check_lengths(head_bytes, size)
    head = _read_exactly(sock, head_bytes)
    return _parsed(head, _read_exactly(sock, size))


def _check_lengths(head_bytes: int, size: int) -> None:
    if head_bytes > MAX_HEADER_BYTES or size > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {head_bytes:,} + {size:,} bytes")


def _parsed(head, payload) -> tuple[dict, dict]:
    """A frame's header and arrays from its header's bytes and the bytes after: ValueError
    for anything that is not a frame (a header that is no object, arrays that do not take
    its bytes exactly, a name twice)."""
    header = json.loads(head)
    listed = header.pop("arrays", None) if isinstance(header, dict) else None
    if not isinstance(listed, list):
        raise ValueError("a frame's header is not an object listing its arrays")
    arrays, at = {}, 0
    for name, dtype, shape in listed:
        if not isinstance(name, str) or name in arrays or not isinstance(shape, list) or \
                not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"a frame's array {name!r} is listed twice or malformed")
        dtype = np.dtype(_dtype(dtype)).newbyteorder("<")
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if at + n > len(payload):
            raise ValueError("a frame's arrays pass its bytes")
        array = np.frombuffer(payload, dtype, count=n // dtype.itemsize,
                              offset=at).reshape(shape)
        arrays[name] = array if sys.byteorder == "little" else \
            array.astype(dtype.newbyteorder("="))
        at += n
    if at != len(payload):
        raise ValueError(f"a frame's arrays take {at:,} of its {len(payload):,} bytes")
    return header, arrays


def _little(a: np.ndarray) -> np.ndarray:
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        return a.astype(a.dtype.newbyteorder("<"))
    return a


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return name


def _read_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ChannelLost("the connection closed")
        got += k
    return buf


__all__ = ["BatchChannel", "BatchServer", "ChannelLost"]
