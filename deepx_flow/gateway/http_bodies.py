"""What the gateway's HTTP calls share, the contract's (`http_app.py`) and the Open Inference
Protocol's (`oip_http.py`, `oip_infer.py`, `direct_infer.py`): reading a body (its size
bounded, its JSON part and the binary bytes after it), the fields it may have, the outputs
it asks for and how, writing tensors as JSON or binary data, and the HTTP status of an
error."""

from __future__ import annotations

import json
import re

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from deepx_flow.contract import tensors
from deepx_flow.errors import DeepxError, InputError, shown
from deepx_flow.gateway.errors import NotFound, TooLarge

HEADER_LENGTH = tensors.BINARY_HEADER
DIGITS = re.compile(r"[0-9]{1,18}")  # str.isdigit takes "²", which int() refuses


def status_of(err: DeepxError) -> int:
    """The HTTP status that says what kind of error `err` is."""
    if isinstance(err, NotFound):
        return 404
    if isinstance(err, TooLarge):
        return 413
    return 400 if err.exit_code == 2 else 500


def not_a_method(method: str, path: str) -> str:
    """What a 405 says: the same for Starlette's routes and the infer call."""
    return f"{method} is not a method of {path} in the contract"


async def read_body(request: Request, limits) -> tuple[dict, bytes]:
    """The request's JSON object, and the binary bytes after it (the binary extension).
    The JSON part may be at most `limits.max_json_bytes` (parsed, JSON numbers take about
    ten times their text's memory: large tensors travel as binary data), the whole body at
    most `limits.max_request_bytes`."""
    data = await gathered(request.stream(), request.headers.get("content-length"), limits)
    request.state.body_bytes = len(data)  # (how much work decoding it is: small_inline)
    return await decoded_body(data, request.headers.get(HEADER_LENGTH), limits)


async def gathered(chunks, declared: str | None, limits) -> bytes:
    """A request's body from the async iterator of its `chunks`: TooLarge, before it is
    read, where its Content-Length (`declared`) is over `limits.max_request_bytes`, or as
    soon as what came passes it."""
    limit = limits.max_request_bytes
    if declared is not None and DIGITS.fullmatch(declared) and int(declared) > limit:
        raise TooLarge(f"the request body is {int(declared):,} bytes, over the limit of "
                       f"{limit:,}")
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the request body is over the limit of {limit:,} bytes")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def decoded_body(data: bytes, json_length: str | None, limits,
                       loads=None) -> tuple[dict, bytes]:
    """A body's JSON object and the binary bytes after it: `json_length` is the value of
    its Inference-Header-Content-Length header (None: all of it is JSON). `loads`: a
    reader tried first (`tensors.loads_with_numbers`), None where it reads no object.
    Decoded on the event loop where small, else in a thread."""
    head, raw = split_body(data, json_length, limits)
    return await small_inline(len(head), decoded_json, head, loads), raw


def split_body(data: bytes, json_length: str | None, limits) -> tuple[bytes, bytes]:
    """A body's JSON part and the binary bytes after it, the JSON within its limit."""
    if json_length is not None:
        if not DIGITS.fullmatch(json_length) or int(json_length) > len(data):
            raise InputError(f"{HEADER_LENGTH} is {shown(json_length)}, not a length within "
                             f"the {len(data):,} bytes of the body")
        head, raw = data[:int(json_length)], data[int(json_length):]
    else:
        head, raw = data, b""
    if len(head) > limits.max_json_bytes:
        raise TooLarge(f"the request's JSON is {len(head):,} bytes, over the limit of "
                       f"{limits.max_json_bytes:,}: send large tensors as binary data "
                       f"(\"parameters\": {{\"binary_data_size\": N}})")
    return head, raw


def decoded_json(head: bytes, loads=None) -> dict:
    """The JSON object of `head`, read by `loads` first where given (see decoded_body)."""
    body = None if loads is None else loads(head)
    try:
        if body is None:
            body = orjson.loads(head)
    except orjson.JSONDecodeError as err:  # (its nesting limit included: 1024 deep)
        if "depth" in str(err):
            raise InputError("the request's JSON is nested too deep") from None
        if "infinity" in str(err):  # valid JSON, but a number past any 64-bit float
            raise InputError(f"the request holds a number beyond the range of a 64-bit "
                             f"float ({err})") from None
        raise InputError(f"the request body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise InputError(f"the request body is {shown(body)}, not a JSON object")
    return body


SMALL_BYTES = 64 << 10  # work on a body this small is done on the event loop (a thread hop
#                        costs more than it does); larger ones go to a thread


async def small_inline(size: int, fn, *args):
    """`fn(*args)` here when `size` bytes are few, else in a thread (a large body must not
    hold the event loop)."""
    if size <= SMALL_BYTES:
        return fn(*args)
    return await run_in_threadpool(fn, *args)


def only_fields(body: dict, fields: set) -> None:
    unknown = sorted(set(body) - fields)
    if unknown:
        raise InputError(f"unknown field(s) {', '.join(map(shown, unknown))} (this call "
                         f"takes {', '.join(sorted(fields))})")


def requested_outputs(body: dict) -> tuple[list | None, set]:
    """The output names asked for (None: all), and those to return as binary data ("*":
    all of them)."""
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise InputError(f"parameters are {shown(params)}, not an object")
    binary = {"*"} if params.get("binary_data_output") is True else set()
    listed = body.get("outputs")
    if listed is None:
        return None, binary
    if not isinstance(listed, list):
        raise InputError(f"outputs is {shown(listed)}, not a list")
    names = []
    for entry in listed:
        if isinstance(entry, str):
            names.append(entry)
        elif isinstance(entry, dict) and "reference" in entry:
            raise InputError(f"output {shown(entry.get('name'))}: outputs written to storage "
                             f"by reference are in the contract but not served yet: define "
                             f"an asset instead")
        elif isinstance(entry, dict) and isinstance(entry.get("name"), str) and \
                set(entry) <= {"name", "parameters"} and \
                isinstance(entry.get("parameters") or {}, dict):
            names.append(entry["name"])
            if (entry.get("parameters") or {}).get("binary_data") is True:
                binary.add(entry["name"])
        else:
            raise InputError(f"an output is {shown(entry)}, not a name or "
                             f"{{\"name\": ..., \"parameters\": ...}}")
    return names, binary


def tensors_response(answer: dict, binary: set) -> Response:
    """An operation's answer (or a read's, whose one output is the tensor read): JSON,
    with its outputs as JSON tensors or binary data."""
    body, json_length = tensors_body(answer, binary)
    if json_length is None:
        return Response(body, media_type="application/json")
    return Response(body, media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(json_length)})


def tensors_body(answer: dict, binary: set, dumps=None) -> tuple[bytes, int | None]:
    """The body of an answer whose "outputs" (name -> array) go as JSON tensors, or as
    binary data where `binary` names them ("*": all), and the length of its JSON part
    where binary data follows it (else None). `dumps`: the JSON encoder (by default the
    standard library's, which refuses a NaN rather than write it as null)."""
    outputs = answer.pop("outputs", None)
    parts = []
    if outputs is not None:
        listed = []
        for name, array in outputs.items():
            if "*" in binary or name in binary:
                raw = tensors.to_raw(array)
                listed.append({"name": name, "datatype": tensors.datatype_of(array.dtype),
                               "shape": list(array.shape),
                               "parameters": {"binary_data_size": len(raw)}})
                parts.append(raw)
            else:
                listed.append(tensors.to_json(name, array))
        answer["outputs"] = listed
    head = dumps(answer) if dumps is not None else \
        json.dumps(answer, allow_nan=False).encode()
    if not parts:
        return head, None
    return b"".join([head, *parts]), len(head)
