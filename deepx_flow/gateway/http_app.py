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

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from deepx_flow.contract import tensors
from deepx_flow.errors import DeepxError, InputError, shown
from deepx_flow.gateway.http_bodies import (DIGITS, not_a_method, only_fields, read_body,
                                            requested_outputs, status_of, tensors_response)


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
