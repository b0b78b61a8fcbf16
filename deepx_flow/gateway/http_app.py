"""The contract's HTTP/JSON mirror: a Starlette (ASGI) app over the transport-free calls of
`service.Gateway`, served by uvicorn (`serve.py`).

Bodies are JSON, tensors OIP's JSON tensors. The binary tensor extension of the Open
Inference Protocol (KServe v2, as Triton speaks it) carries raw bytes instead: a request
whose `Inference-Header-Content-Length` header says how long its JSON part is, followed by
the bytes of each input that says `"parameters": {"binary_data_size": n}`, in order; and
outputs asked for with `"parameters": {"binary_data_output": true}` (all) or an output's
`{"name": ..., "parameters": {"binary_data": true}}` come back the same way.

Errors are `{"error": message, "kind": class}`, the message and class name of the Python
DeepxError (the Open Inference Protocol's calls answer `{"error": message}` alone), 400 for a
bad request (a malformed body, an unknown operator, a bad shape or dtype, a missing input,
a plan that cannot fit), 404 for an unknown operation or asset, 413 for a body over the
limit.
"""

from __future__ import annotations

import json
import re

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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


def make_app(gateway, creds=None):
    """The ASGI app serving `gateway` (a `service.Gateway`), to callers `creds` (an
    `auth.Credentials`; default none needed) allows: the protocol's infer call
    (`oip_infer.py`), then Starlette's routes."""

    async def capabilities(request: Request):
        return JSONResponse(gateway.capabilities())

    limits = gateway.limits

    async def analyze(request: Request):
        body, _ = await read_body(request, limits)
        only_fields(body, {"graph"})
        return JSONResponse(await run_in_threadpool(gateway.analyze, _needs(body, "graph")))

    async def execute(request: Request):
        body, raw = await read_body(request, limits)

        def decoded():  # in a thread: a large body would hold the event loop
            only_fields(body, {"graph", "inputs", "outputs", "wait_seconds", "operation_id",
                         "parameters"})
            return (tensors.from_json_list(body.get("inputs", []), raw, "inputs"),
                    requested_outputs(body))
        inputs, (names, binary) = await run_in_threadpool(decoded)
        answer = await gateway.execute(_needs(body, "graph"), inputs, names,
                                       body.get("wait_seconds"), body.get("operation_id"))
        return await run_in_threadpool(tensors_response, answer, binary)

    async def operation(request: Request):
        # at once unless asked to wait, as over gRPC
        wait = _number(request.query_params.get("wait_seconds", "0"), "wait_seconds")
        binary = request.query_params.get("binary_data_output", "false") == "true"
        answer = await gateway.operation(request.path_params["id"], wait)
        return await run_in_threadpool(tensors_response, answer, {"*"} if binary else set())

    async def cancel(request: Request):
        answer = await gateway.cancel(request.path_params["id"])
        return await run_in_threadpool(tensors_response, answer, set())

    async def runs(request: Request):
        limit = request.query_params.get("limit")
        if limit is not None and not DIGITS.fullmatch(limit):
            raise InputError(f"limit {shown(limit)} is not a whole number")
        return JSONResponse(await run_in_threadpool(
            gateway.runs, request.query_params.get("status"),
            None if limit is None else int(limit)))

    async def run(request: Request):
        return JSONResponse(await run_in_threadpool(gateway.run, request.path_params["id"]))

    async def registry(request: Request):
        return JSONResponse(await run_in_threadpool(gateway.registry))

    async def assets(request: Request):
        return JSONResponse(await run_in_threadpool(gateway.assets.assets))

    async def versions(request: Request):
        return JSONResponse(await run_in_threadpool(gateway.assets.versions,
                                                    request.path_params["name"]))

    async def define(request: Request):
        body, _ = await read_body(request, limits)
        only_fields(body, {"name", "graph", "dependencies", "description", "partitions",
                     "partition_axis", "checks"})
        return JSONResponse(await run_in_threadpool(
            gateway.assets.define, _needs(body, "name"), _needs(body, "graph"),
            body.get("dependencies"), body.get("description", ""), body.get("partitions"),
            body.get("partition_axis"), body.get("checks")))

    async def materialize(request: Request):
        body, _ = await read_body(request, limits)
        only_fields(body, {"partitions", "force", "upstream", "wait_seconds", "operation_id"})
        answer = await gateway.materialize(
            request.path_params["name"], body.get("partitions"), body.get("force", False),
            body.get("wait_seconds"), body.get("operation_id"), body.get("upstream", False))
        return await run_in_threadpool(tensors_response, answer, set())

    async def read(request: Request):
        body, _ = await read_body(request, limits)
        only_fields(body, {"version", "partition", "slice", "parameters"})
        _, binary = requested_outputs(body)
        name = request.path_params["name"]
        array = await run_in_threadpool(gateway.assets.read, name, body.get("version", ""),
                                        body.get("partition", ""), body.get("slice"))
        return await run_in_threadpool(tensors_response, {"outputs": {name: array}}, binary)

    from deepx_flow.gateway.oip_http import routes as inference_routes
    from deepx_flow.gateway.oip_infer import InferenceFirst
    routes = inference_routes(gateway) + [
              Route("/v1/capabilities", capabilities, methods=["GET"]),
              Route("/v1/registry", registry, methods=["GET"]),
              Route("/v1/runs", runs, methods=["GET"]),
              Route("/v1/runs/{id}", run, methods=["GET"]),
              Route("/v1/graphs:analyze", analyze, methods=["POST"]),
              Route("/v1/graphs:execute", execute, methods=["POST"]),
              Route("/v1/operations/{id}:cancel", cancel, methods=["POST"]),
              Route("/v1/operations/{id}", operation, methods=["GET"]),
              Route("/v1/assets", assets, methods=["GET"]),
              Route("/v1/assets:define", define, methods=["POST"]),
              Route("/v1/assets/{name}/versions", versions, methods=["GET"]),
              Route("/v1/assets/{name}:materialize", materialize, methods=["POST"]),
              Route("/v1/assets/{name}:read", read, methods=["POST"])]
    app = InferenceFirst(Starlette(routes=routes, exception_handlers={
        DeepxError: _error, HTTPException: _no_such_call}), gateway)
    if creds is not None and creds.required:
        app = _Authenticated(app, creds)
    return app


def make_metrics_app(gateway, creds=None) -> Starlette:
    """The metrics port's app: `GET /metrics` alone, to callers `creds` allows."""
    from deepx_flow.gateway.oip_http import routes as inference_routes
    app = Starlette(routes=[r for r in inference_routes(gateway) if r.path == "/metrics"],
                    exception_handlers={DeepxError: _error, HTTPException: _no_such_call})
    if creds is not None and creds.required:
        app.add_middleware(_Authenticated, creds=creds)
    return app


# Liveness and readiness say nothing but that: an orchestrator's probes (Kubernetes' send
# no credentials) ask them without a login, as Triton's and KServe's are asked.
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})


class _Authenticated:
    """Answer 401 to a request whose Authorization header `creds` does not allow (but for
    the health checks, OPEN_PATHS)."""

    def __init__(self, app, creds):
        self.app, self.creds = app, creds

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path") not in OPEN_PATHS:
            headers = dict(scope.get("headers") or ())
            given = headers.get(b"authorization")
            if not self.creds.allows(given.decode("latin-1") if given else None):
                schemes = (["Bearer"] if self.creds.token else []) + \
                    (['Basic realm="deepx_flow"'] if self.creds.users else [])
                answer = JSONResponse({"error": "unauthenticated: this gateway needs a "
                                                "bearer token or a user and password"},
                                      status_code=401,
                                      headers={"WWW-Authenticate": ", ".join(schemes)})
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _error(request: Request, err: DeepxError):
    answer = {"error": str(err)}
    if not request.url.path.startswith("/v2/"):  # (the protocol's errors are its own)
        answer["kind"] = type(err).__name__  # what every SDK's error carries
    return JSONResponse(answer, status_code=status_of(err))


async def _no_such_call(request: Request, err: HTTPException):
    """A path or method the contract has no call for (404, 405): said as every error is."""
    if err.status_code == 404:
        message = (f"no call {request.method} {request.url.path} in the contract "
                   f"(docs/contract.md lists its calls)")
    elif err.status_code == 405:
        message = not_a_method(request.method, request.url.path)
    else:
        message = str(err.detail)
    return JSONResponse({"error": message}, status_code=err.status_code, headers=err.headers)


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


def _needs(body: dict, field: str):
    if field not in body:
        raise InputError(f"the request has no {field!r}")
    return body[field]


def _number(text, name: str):
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{name} is {shown(text)}, not a number") from None


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
