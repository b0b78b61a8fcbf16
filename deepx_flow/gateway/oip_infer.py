"""The Open Inference Protocol's infer call over HTTP,
`POST /v2/models/{model}[/versions/{version}]/infer`, answered by a plain ASGI app in front
of the gateway's Starlette app (`http_app.make_app`), which takes every other path. (A
small request, the most common, is answered by the HTTP protocol itself, without an ASGI
cycle, in the same steps: `direct_infer.py`, which shares them from here.)

Inference is the call a server of models takes thousands of times a second, and on a one-row
request Starlette's layers (its middleware, routing, Request and Response objects) cost
about as much as all the rest: at 64 clients of the MLP, the event loop that reads every
request spent 40% of its time in them. Here the path is matched first and the call made in
the fewest steps: the body read (within the gateway's limits), decoded (its tensors'
numbers by simdjson, straight into arrays: `tensors.loads_with_numbers`) and checked
(`contract/tensors.py`), queued for the model's batcher (`serving/batcher.py`), and the
outputs written with orjson. Its answers and errors are those of every other call: the
protocol's `{"error": message}`, 400 for a bad request, 404 for a model or version not
served, 405 for another method.
"""

from __future__ import annotations

import asyncio
import logging
import re

import orjson

from deepx_flow.contract import tensors
from deepx_flow.errors import DeepxError, InputError, shown
from deepx_flow.gateway.http_bodies import (HEADER_LENGTH, decoded_body, gathered,
                                            not_a_method, only_fields, requested_outputs,
                                            small_inline, status_of, tensors_body)
from deepx_flow.gateway.oip_http import repository_of

log = logging.getLogger(__name__)

PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")  # Starlette's {x}: [^/]+
JSON = [(b"content-type", b"application/json")]
BINARY = [(b"content-type", b"application/octet-stream")]
LENGTH_KEY, JSON_LENGTH_KEY = b"content-length", HEADER_LENGTH.lower().encode()


class InferenceFirst:
    """The ASGI app answering the infer call of `gateway`'s models, and handing every
    other request to `app`."""

    def __init__(self, app, gateway):
        self.app, self.gateway = app, gateway

    async def __call__(self, scope, receive, send):
        found = PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        headers = JSON
        try:
            if scope["method"] != "POST":
                status, headers = 405, JSON + [(b"allow", b"POST")]
                body = orjson.dumps({"error": not_a_method(scope["method"], scope["path"])})
            else:
                status = 200
                body, headers = await self._infer(scope, receive, found[1], found[2] or "")
        except _Gone:
            return  # (no one to answer)
        except Exception as err:
            status, body = error_answer(err, scope["method"], scope["path"])
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + [(LENGTH_KEY, b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    async def _infer(self, scope, receive, name: str, version: str) -> tuple[bytes, list]:
        """The answer to one infer request: (its body, its headers but the length)."""
        models = repository_of(self.gateway)
        limits = self.gateway.limits
        models.model(name, version)  # 404 before the body is read
        declared = json_length = None
        for key, value in scope["headers"]:
            if key == LENGTH_KEY:
                declared = value.decode("latin-1")
            elif key == JSON_LENGTH_KEY:
                json_length = value.decode("latin-1")
        loop = asyncio.get_running_loop()
        with models.arriving(name) as arrival:
            data = await gathered(_chunks(receive), declared, limits)
            body, raw = await decoded_body(data, json_length, limits,
                                           tensors.loads_with_numbers)
            arrays, (names, binary) = await small_inline(len(data), request_inputs, body, raw)
            model, pending = models.submit(name, version, arrays, names, arrival, loop)
        outputs = await pending  # (no thread held while it waits)
        return await small_inline(sum(a.nbytes for a in outputs.values()), answer_of,
                                  model, outputs, body, binary)


def answer_of(model, outputs: dict, body: dict, binary: set) -> tuple[bytes, list]:
    """The answer to an infer request `body` that `model` gave `outputs` (name -> array):
    its body, and its headers but the length."""
    answer = {"model_name": model.name, "model_version": model.version, "outputs": outputs}
    if "id" in body:
        answer["id"] = body["id"]
    # (orjson: every value here is a string, or a number made finite by to_values)
    data, json_length = tensors_body(answer, binary, orjson.dumps)
    if json_length is None:
        return data, JSON
    return data, BINARY + [(JSON_LENGTH_KEY, b"%d" % json_length)]


def error_answer(err: Exception, method: str, path: str) -> tuple[int, bytes]:
    """The status and body that say what went wrong: a DeepxError's own status, or 500 for
    anything else (a bug: logged, as Starlette's ServerErrorMiddleware would)."""
    if isinstance(err, DeepxError):
        return status_of(err), orjson.dumps({"error": str(err)})
    log.error("%s %s failed", method, path, exc_info=err)
    return 500, orjson.dumps({"error": f"internal error: {type(err).__name__}: {err}"})


def request_inputs(body: dict, raw: bytes) -> tuple[dict, tuple]:
    """An infer request's inputs (name -> array) and the outputs it asks for (names, and
    those to answer as binary data), each mistake an InputError naming it."""
    only_fields(body, {"id", "parameters", "inputs", "outputs"})
    if "inputs" not in body:
        raise InputError("the request has no 'inputs'")
    arrays = tensors.from_json_list(body["inputs"], raw, "inputs")
    stored = [n for n, a in arrays.items() if isinstance(a, tensors.Reference)]
    if stored:
        raise InputError(f"input {stored[0]!r}: inference takes the tensor's data, not a "
                         f"reference to storage")
    asked = requested_outputs(body)
    if "id" in body and not isinstance(body["id"], str):
        raise InputError(f"id is {shown(body['id'])}, not a string")
    return arrays, asked


class _Gone(Exception):
    """The client went away before its request was read."""


async def _chunks(receive):
    """The body's chunks, as ASGI's `receive` gives them."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


__all__ = ["InferenceFirst"]
