"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService`, as Triton serves
it (`proto/inference/grpc_service.proto`), on the gateway's gRPC port beside the contract's
services, so that `tritonclient.grpc` works unmodified.

An infer request's inputs carry typed `contents` or, all of them, `raw_input_contents` (one
per input, in order); the outputs come back as `raw_output_contents`, as Triton answers.
Errors are the status codes of the HTTP mirror's: INVALID_ARGUMENT for a bad request,
NOT_FOUND for a model or version that is not served.
"""

from __future__ import annotations

import asyncio
import contextlib

from deepx_flow.contract import tensors
from deepx_flow.contract.inference import grpc_service_pb2 as pb
from deepx_flow.errors import InputError
from deepx_flow.gateway.errors import NotFound
from deepx_flow.gateway.grpc_calls import awaited, called
from deepx_flow.gateway.oip_http import EXTENSIONS, SERVER_NAME

SERVICE = "inference.GRPCInferenceService"  # the protocol's name (the .proto's package is
#                                             deepx.inference: see its first comment)


def add_to_server(servicer, server) -> None:
    """Serve `servicer`'s calls under the protocol's service name, each call (de)coded with
    the messages the .proto declares."""
    import grpc
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for method in service.methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name), request_deserializer=request.FromString,
            response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE,
                                                                          handlers),))


class InferenceService:
    """The protocol's calls over `gateway.models` (a ModelRepository, or None: no model is
    then found)."""

    def __init__(self, gateway):
        self.gateway = gateway

    def _models(self):
        if self.gateway.models is None:
            raise NotFound("this server has no model repository (deepx-flow serve "
                           "--model-repository DIR)")
        return self.gateway.models

    async def _call(self, context, call, *args):
        return await called(context, call, *args)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):
        from deepx_flow import __version__
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__,
                                         extensions=list(EXTENSIONS))

    async def ModelReady(self, request, context):
        ready = self.gateway.models is not None and \
            self.gateway.models.ready(request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request, context):
        model = await self._call(context, lambda: self._models().model(request.name,
                                                                        request.version))
        meta = model.metadata()
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]],
            outputs=[tensor(**t) for t in meta["outputs"]])

    async def ModelInfer(self, request, context):
        from deepx_flow.gateway.http_bodies import small_inline

        async def submitted(arrival):  # (queued on the loop: the Future is asyncio's)
            models = self._models()
            models.model(request.model_name, request.model_version)  # NOT_FOUND first
            arrays = await small_inline(request.ByteSize(), _inputs, request)
            names = [o.name for o in request.outputs] or None
            return models.submit(request.model_name, request.model_version, arrays, names,
                                 arrival, asyncio.get_running_loop())
        arriving = self.gateway.models.arriving(request.model_name) \
            if self.gateway.models is not None else contextlib.nullcontext()
        with arriving as arrival:
            model, pending = await awaited(context, submitted(arrival))
        outputs = await awaited(context, pending)  # (no thread held while it waits)
        answer = pb.ModelInferResponse(model_name=model.name, model_version=model.version,
                                       id=request.id)
        for name, array in outputs.items():
            answer.outputs.add(name=name, datatype=tensors.datatype_of(array.dtype),
                               shape=list(array.shape))
            answer.raw_output_contents.append(tensors.to_raw(array))
        return answer

    async def ModelStatistics(self, request, context):
        listed = await self._call(context, lambda: self._models().statistics(
            request.name, request.version))
        return pb.ModelStatisticsResponse(model_stats=[_statistics(s) for s in listed])

    async def RepositoryIndex(self, request, context):
        listed = await self._call(context, lambda: self._models().index(request.ready))
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**m) for m in listed])

    async def RepositoryModelLoad(self, request, context):
        await self._call(context, lambda: self._models().load(request.model_name))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self._call(context, lambda: self._models().unload(request.model_name))
        return pb.RepositoryModelUnloadResponse()


def _inputs(request) -> dict:
    """Name -> array of a ModelInferRequest's inputs: typed contents, or raw bytes for all."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InputError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: "
                         f"give one for each input, in order, or typed contents")
    arrays = {}
    for index, tensor in enumerate(request.inputs):
        if tensor.name in arrays:
            raise InputError(f"input {tensor.name!r} is given twice")
        shape = list(tensor.shape)
        if raw:
            if tensor.HasField("contents"):
                raise InputError(f"input {tensor.name!r}: both contents and raw contents")
            arrays[tensor.name] = tensors.from_raw(tensor.name, tensor.datatype, shape,
                                                   raw[index])
            continue
        field = tensors.CONTENTS_FIELD.get(tensor.datatype)
        if field is None:
            tensors.dtype_of(tensor.datatype, tensor.name)  # an unknown datatype: said so
            raise InputError(f"input {tensor.name!r}: {tensor.datatype} travels as raw "
                             f"contents, not typed contents")
        arrays[tensor.name] = tensors.from_values(tensor.name, tensor.datatype, shape,
                                                  list(getattr(tensor.contents, field)))
    return arrays


def _statistics(s: dict) -> pb.ModelStatistics:
    duration = pb.StatisticDuration
    stats = s["inference_stats"]
    return pb.ModelStatistics(
        name=s["name"], version=s["version"], last_inference=s["last_inference"],
        inference_count=s["inference_count"], execution_count=s["execution_count"],
        inference_stats=pb.InferStatistics(**{k: duration(**v) for k, v in stats.items()}),
        batch_stats=[pb.InferBatchStatistics(
            batch_size=b["batch_size"], compute_input=duration(**b["compute_input"]),
            compute_infer=duration(**b["compute_infer"]),
            compute_output=duration(**b["compute_output"])) for b in s["batch_stats"]])
