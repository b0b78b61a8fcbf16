"""The Open Inference Protocol (KServe v2) over HTTP, verbatim, on the gateway's HTTP port:
health, server and model metadata, readiness, inference (JSON tensors and the binary tensor
extension), Triton's model repository extension (index, load, unload) and statistics, so
that `tritonclient.http` and KServe's clients work unmodified.

    GET  /v2/health/live, /v2/health/ready
    GET  /v2                                         server metadata
    GET  /v2/models/{model}[/versions/{v}]           model metadata
    GET  /v2/models/{model}[/versions/{v}]/ready
    POST /v2/models/{model}[/versions/{v}]/infer     (oip_infer.py: ahead of Starlette)
    GET  /v2/models[/{model}[/versions/{v}]]/stats
    POST /v2/repository/index
    POST /v2/repository/models/{model}/load, .../unload
    GET  /metrics                                    Prometheus's text (serving/metrics.py)

Errors are the protocol's `{"error": message}`: 400 for a bad request (a malformed body, a
wrong input name, datatype or shape), 404 for a model or version that is not served.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deepx_flow.contract import tensors
from deepx_flow.errors import InputError, shown
from deepx_flow.gateway.errors import NotFound

SERVER_NAME = "deepx_flow"
EXTENSIONS = ("binary_tensor_data", "model_repository", "statistics")


def repository_of(gateway):
    """`gateway`'s ModelRepository: NotFound when the server has none (every model is then
    not found)."""
    if gateway.models is None:
        raise NotFound("this server has no model repository (deepx-flow serve "
                       "--model-repository DIR)")
    return gateway.models


def routes(gateway) -> list[Route]:
    """The protocol's routes over `gateway` (whose `models` is a ModelRepository, or None
    when the server has no model repository), but infer's (`oip_infer.InferenceFirst`)."""
    from deepx_flow.gateway.http_bodies import only_fields, read_body
    limits = gateway.limits

    def version_of(request: Request) -> str:
        return request.path_params.get("version", "")

    async def live(request: Request):
        return JSONResponse({"live": True})

    async def ready(request: Request):
        return JSONResponse({"ready": True})

    async def server(request: Request):
        from deepx_flow import __version__
        return JSONResponse({"name": SERVER_NAME, "version": __version__,
                             "extensions": list(EXTENSIONS)})

    async def metadata(request: Request):
        model = repository_of(gateway).model(request.path_params["model"],
                                             version_of(request))
        return JSONResponse(model.metadata())

    async def model_ready(request: Request):
        repository_of(gateway).model(request.path_params["model"],  # or 404
                                     version_of(request))
        return JSONResponse({"name": request.path_params["model"], "ready": True})

    async def stats(request: Request):
        models = repository_of(gateway)
        return JSONResponse({"model_stats": await run_in_threadpool(
            models.statistics, request.path_params.get("model", ""), version_of(request))})

    async def index(request: Request):
        empty = not (await request.body()).strip()  # (Starlette keeps it for read_body)
        body = {} if empty else (await read_body(request, limits))[0]
        only_fields(body, {"ready"})
        ready_only = body.get("ready", False)
        if type(ready_only) is not bool:
            raise InputError(f"ready is {shown(ready_only)}, not true or false")
        return JSONResponse(await run_in_threadpool(repository_of(gateway).index, ready_only))

    async def load(request: Request):
        await run_in_threadpool(repository_of(gateway).load, request.path_params["model"])
        return JSONResponse({})

    async def metrics(request: Request):
        from deepx_flow.serving.metrics import CONTENT_TYPE, metrics_text
        return Response(await run_in_threadpool(metrics_text, gateway.models),
                        media_type=CONTENT_TYPE)

    async def unload(request: Request):
        await run_in_threadpool(repository_of(gateway).unload, request.path_params["model"])
        return JSONResponse({})

    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    return [Route("/v2/health/live", live, methods=["GET"]),
            Route("/v2/health/ready", ready, methods=["GET"]),
            Route("/v2", server, methods=["GET"]),
            Route("/v2/models/stats", stats, methods=["GET"]),
            Route(model, metadata, methods=["GET"]),
            Route(versioned, metadata, methods=["GET"]),
            Route(model + "/ready", model_ready, methods=["GET"]),
            Route(versioned + "/ready", model_ready, methods=["GET"]),
            Route(model + "/stats", stats, methods=["GET"]),
            Route(versioned + "/stats", stats, methods=["GET"]),
            Route("/v2/repository/index", index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", unload, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"])]


__all__ = ["repository_of", "routes"]
