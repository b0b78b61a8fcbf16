"""The infer call answered by the gateway's HTTP protocol itself, without an ASGI cycle.

A one-row inference is the call the gateway takes thousands of times a second, and its event
loop, which reads every request, is what limits how many: at 64 clients of the conv net it
was busy four fifths of the time. uvicorn gives each request an ASGI cycle (a scope of a
dozen keys, an asyncio Event, a task, and messages through `receive` and `send`), which for
a small body costs about as much as decoding its 784 numbers (bench: a bare httptools
protocol answered the same JSON 35% faster than uvicorn's). Here the protocol (uvicorn's
own, `OneSendHttp`) takes a small infer request itself once its headers are in: the body
is gathered as uvicorn gathers it, then decoded, checked and queued for the model's batcher
in one step, and the answer written from the batch's callback, with no task at all.

It takes only what it answers exactly as the ASGI path would (`oip_infer.InferenceFirst`,
which shares its steps): a POST to the infer path without escapes, one HTTP/1.x request at
a time on its connection (a pipelined one waits as uvicorn makes it wait), a body of at
most SMALL_BYTES by its Content-Length (not chunked, no `Expect: 100-continue`), allowed by
the gateway's credentials, on a connection whose client reads its answers (while the
transport's buffer is full, the ASGI way waits for the client before answering, and reads
nothing more meanwhile). Everything else (a larger body, a 405, a 401, other calls) goes
the ASGI way. Every answer is written from a callback after the parser's (so the keep-alive
timer never runs while a request pipelined behind it is read), carries uvicorn's own
default headers (date, server), and closes the connection where the request asked or the
server is stopping; a graceful stop waits for them as for any other (uvicorn waits for
connections to close).
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from deepx_flow.contract import tensors
from deepx_flow.gateway.http_bodies import DIGITS, SMALL_BYTES, decoded_json, split_body
from deepx_flow.gateway.oip_http import repository_of
from deepx_flow.gateway.oip_infer import (JSON, JSON_LENGTH_KEY, LENGTH_KEY, PATH,
                                          answer_of, error_answer, request_inputs)
from deepx_flow.gateway.one_send import OneSendHttp

log = logging.getLogger(__name__)

_PREFIX = b"/v2/models/"
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode())
                 for s in HTTPStatus}


def direct_infer_http(gateway, creds=None) -> type:
    """The HTTP protocol class for uvicorn (`Config(http=...)`) that answers `gateway`'s
    small infer requests itself, to callers `creds` (`auth.Credentials`) allows."""
    return type("DirectInferHttp", (DirectInferHttp,), {"gateway": gateway, "creds": creds})


class DirectInferHttp(OneSendHttp):
    """uvicorn's httptools protocol (with answers in one send), taking small infer requests
    itself. Made for a gateway by `direct_infer_http`."""

    gateway = None
    creds = None

    def on_headers_complete(self) -> None:
        call = self._direct_call()
        if call is None:
            super().on_headers_complete()
        else:
            self.cycle = call  # (uvicorn's on_body gathers into it, as into its own)

    def on_body(self, body: bytes) -> None:
        if isinstance(self.cycle, _DirectCall):
            # (never paused: nothing but the end of the body would resume reading, and a
            # direct call's body is at most SMALL_BYTES)
            self.cycle.body += body
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if isinstance(cycle, _DirectCall) and cycle.more_body:
            cycle.more_body = False
            cycle.start()
            return
        super().on_message_complete()

    def _direct_call(self):
        """A _DirectCall for the request whose headers are in, or None where it goes the
        ASGI way."""
        if self.gateway is None or self.limit_concurrency is not None or \
                self.flow.write_paused or \
                (self.cycle is not None and not self.cycle.response_complete) or \
                self.expect_100_continue or self.root_path or \
                self.parser.get_method() != b"POST" or self.parser.should_upgrade():
            return None
        url = self.url
        if not url.startswith(_PREFIX) or b"%" in url or b"#" in url:
            return None
        path = url.partition(b"?")[0].decode("ascii", "replace")
        found = PATH.fullmatch(path)
        if found is None:
            return None
        length = json_length = authorization = None
        for name, value in self.headers:
            if name == LENGTH_KEY:
                if length is not None:
                    return None  # (said twice: the ASGI way says what is wrong)
                length = value
            elif name == JSON_LENGTH_KEY:
                json_length = value.decode("latin-1")
            elif name == b"transfer-encoding":
                return None
            elif name == b"authorization":
                authorization = value.decode("latin-1")
        if length is None or not DIGITS.fullmatch(length.decode("latin-1")) or \
                int(length) > min(SMALL_BYTES, self.gateway.limits.max_request_bytes):
            return None
        if self.creds is not None and not self.creds.allows(authorization):
            return None  # (answered 401 the ASGI way)
        keep_alive = self.parser.get_http_version() != "1.0" and \
            self.parser.should_keep_alive()
        return _DirectCall(self, path, found[1], found[2] or "", json_length, keep_alive)


class _Unwaited:
    """What uvicorn's protocol sets when a body part or a disconnection comes (an ASGI
    cycle's Event): here nothing waits on it."""

    def set(self) -> None:
        pass


_UNWAITED = _Unwaited()


class _DirectCall:
    """One infer request that `protocol` answers itself: the attributes uvicorn's protocol
    reads and writes of its cycle (body, more_body, response_complete, disconnected,
    keep_alive, message_event), and the steps of the call."""

    message_event = _UNWAITED

    def __init__(self, protocol, path: str, name: str, version: str, json_length,
                 keep_alive: bool):
        self.protocol, self.path, self.name, self.version = protocol, path, name, version
        self.json_length, self.keep_alive = json_length, keep_alive
        self.body = bytearray()
        self.more_body = True
        self.response_complete = False
        self.disconnected = False

    def start(self) -> None:
        """The body is in: decode, check and queue it; answered when its batch ends."""
        gateway = self.protocol.gateway
        try:
            models = repository_of(gateway)
            models.model(self.name, self.version)  # 404 first, as the ASGI way says it
            with models.arriving(self.name) as arrival:
                head, raw = split_body(bytes(self.body), self.json_length, gateway.limits)
                self.body = None
                request = decoded_json(head, tensors.loads_with_numbers)
                arrays, (names, binary) = request_inputs(request, raw)
                model, pending = models.submit(self.name, self.version, arrays, names,
                                               arrival, self.protocol.loop)
        except Exception as err:
            # answered once the parser's callbacks are done (as every answer is): a request
            # pipelined behind this one then waits for it, as uvicorn makes it wait, and
            # its keep-alive timer is not started while that one is read
            self.protocol.loop.call_soon(self._failed, err)
            return
        pending.add_done_callback(lambda done: self._answer(done, model, request, binary))

    def _answer(self, done, model, request: dict, binary: set) -> None:
        if self.disconnected:
            return  # (no one to answer)
        try:
            outputs = done.result()
            if sum(a.nbytes for a in outputs.values()) > SMALL_BYTES:
                # a large answer is encoded in a thread: the event loop must not wait on it
                self.protocol.loop.run_in_executor(
                    None, answer_of, model, outputs, request, binary).add_done_callback(
                        self._encoded)
                return
            answer = answer_of(model, outputs, request, binary)
        except BaseException as err:  # (cancelled included: the batcher stopped)
            self._failed(err)
            return
        self._send(200, *answer)

    def _encoded(self, done) -> None:
        if self.disconnected:
            return
        try:
            answer = done.result()
        except BaseException as err:
            self._failed(err)
            return
        self._send(200, *answer)

    def _failed(self, err: BaseException) -> None:
        if not isinstance(err, Exception):
            err = RuntimeError(f"the request's batch ended without an answer "
                               f"({type(err).__name__})")
        self._send(*error_answer(err, "POST", self.path), JSON)

    def _send(self, status: int, body: bytes, headers: list) -> None:
        """Write the answer, once; the connection is aborted where that fails (a callback's
        error would only be logged, and the client left waiting)."""
        protocol = self.protocol
        transport = protocol.transport
        if self.response_complete:
            return
        self.response_complete = True
        if self.disconnected or transport.is_closing():
            return
        try:
            self._write(transport, status, body, headers)
        except Exception:
            log.exception("answering POST %s failed", self.path)
            transport.abort()

    def _write(self, transport, status: int, body: bytes, headers: list) -> None:
        protocol = self.protocol
        lines = [_STATUS_LINES[status]]
        for name, value in protocol.server_state.default_headers + headers:
            lines += [name, b": ", value, b"\r\n"]
        lines.append(b"content-length: %d\r\n" % len(body))
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines += [b"\r\n", body]
        transport.write(b"".join(lines))
        if not self.keep_alive:
            transport.close()
        protocol.on_response_complete()  # (a pipelined request next, or keep-alive's timer)


__all__ = ["DirectInferHttp", "direct_infer_http"]
