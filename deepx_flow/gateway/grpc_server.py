"""The contract over gRPC: `deepx.v1.GraphService` on grpcio's asyncio server, over the same
transport-free calls as the HTTP mirror (`service.Gateway`).

Messages stay under the limit (`Limits.max_message_bytes`, gRPC's usual 4 MiB): a tensor
whose bytes would pass it travels as a header marked `streamed` and then `TensorChunk`
messages of at most `max_chunk_bytes`. An execution answers with the operation (its state;
when it succeeded, its outputs' headers, small ones with their bytes), then the chunks of
the streamed outputs, in order; a client that got "running" asks GetOperation later, which
answers the same way.

Errors are gRPC status codes with the DeepxError's text: INVALID_ARGUMENT for a bad request,
NOT_FOUND for an unknown operation, RESOURCE_EXHAUSTED for inputs over the limit,
UNAUTHENTICATED for missing or wrong credentials (`authorization` metadata, as over HTTP).
"""

from __future__ import annotations

import grpc

from deepx_flow.contract import tensors
from deepx_flow.contract.streams import HEADER_SLACK
from deepx_flow.contract.deepx.v1 import (catalog_pb2, catalog_pb2_grpc, graphs_pb2,
                                          graphs_pb2_grpc, tensor_pb2)
from deepx_flow.errors import DeepxError, InputError
from deepx_flow.gateway.errors import TooLarge
from deepx_flow.gateway.grpc_calls import abort_with, awaited, called



class GraphService(graphs_pb2_grpc.GraphServiceServicer):
    """The servicer: each call decodes its messages into `gateway`'s calls."""

    def __init__(self, gateway):
        self.gateway = gateway

    async def GetCapabilities(self, request, context):
        answer = self.gateway.capabilities()
        return graphs_pb2.Capabilities(
            protocol_version=answer["protocol_version"],
            server_version=answer["server_version"],
            operators=[graphs_pb2.OperatorInfo(**o) for o in answer["operators"]],
            operator_table_hash=answer["operator_table_hash"],
            limits=graphs_pb2.Limits(**answer["limits"]),
            extensions=answer["extensions"], datatypes=answer["datatypes"])

    async def AnalyzeGraph(self, request, context):
        answer = await called(context, self.gateway.analyze, request.graph_json)
        return graphs_pb2.AnalyzeGraphResponse(
            inputs=[graphs_pb2.AnalyzeGraphResponse.Value(**v) for v in answer["inputs"]],
            outputs=[graphs_pb2.AnalyzeGraphResponse.Value(**v) for v in answer["outputs"]],
            plan=answer["plan"], tasks=answer["tasks"], nodes=answer["nodes"])

    async def ExecuteGraph(self, request_iterator, context):
        limits = self.gateway.limits
        try:
            header, inputs = await _execute_request(request_iterator, limits)
        except DeepxError as err:
            await abort_with(context, err)
        outputs = [t.name for t in header.outputs] or None
        wait = header.wait_seconds if header.HasField("wait_seconds") else None
        answer = await awaited(context, self.gateway.execute(
            header.graph_json, inputs, outputs, wait, header.operation_id or None))
        for message in _operation_messages(answer, limits):
            yield message

    async def GetOperation(self, request, context):
        wait = request.wait_seconds if request.HasField("wait_seconds") else 0.0
        answer = await awaited(context, self.gateway.operation(request.id, wait))
        for message in _operation_messages(answer, self.gateway.limits):
            yield message

    async def CancelOperation(self, request, context):
        answer = await awaited(context, self.gateway.cancel(request.id))
        return _operation(answer, [])


async def _execute_request(messages, limits) -> tuple:
    """The header of an ExecuteGraph request and its inputs (name -> array), streamed ones
    assembled from their chunks."""
    header, assembler, streamed = None, None, {}
    total = 0
    async for message in messages:
        part = message.WhichOneof("part")
        if header is None:
            if part != "header":
                raise InputError("an ExecuteGraph request starts with its header")
            header = message.header
            for index, tensor in enumerate(header.inputs):
                if tensor.streamed:
                    size = tensors.byte_size(tensor.datatype, tensor.shape, tensor.name)
                    if size > limits.max_request_bytes:
                        raise TooLarge(f"tensor {tensor.name!r}: {size:,} bytes, over the "
                                       f"limit of {limits.max_request_bytes:,}")
                    streamed[index] = (tensor.name, size)
            assembler = tensors.Assembler(streamed)
            total = header.ByteSize()
            if any(t.HasField("reference") for t in header.outputs):
                raise InputError("outputs written to storage by reference are in the "
                                 "contract but not served yet: define an asset instead")
        elif part == "input_chunk":
            chunk = message.input_chunk
            total += len(chunk.data)
            if total > limits.max_request_bytes:
                raise TooLarge(f"the request's inputs pass the limit of "
                               f"{limits.max_request_bytes:,} bytes")
            assembler.add(chunk.tensor, chunk.offset, chunk.data)
        else:
            raise InputError("a second header in one ExecuteGraph request")
    if header is None:
        raise InputError("an ExecuteGraph request with no header")
    received = assembler.finish()
    inputs = {}
    for index, tensor in enumerate(header.inputs):
        if tensor.name in inputs:
            raise InputError(f"input {tensor.name!r} is given twice")
        inputs[tensor.name] = tensors.from_message(tensor, received.get(index))
    return header, inputs


def _operation(answer: dict, outputs: list) -> graphs_pb2.Operation:
    made = answer.get("materialized")
    return graphs_pb2.Operation(
        id=answer["operation"], state=answer["state"], kind=answer["kind"],
        run_id=answer.get("run_id") or "", error=answer.get("error") or "",
        outputs=outputs, created_at=answer.get("created_at") or 0.0,
        ended_at=answer.get("ended_at") or 0.0, dashboard=answer.get("dashboard") or "",
        progress=None if "progress" not in answer else graphs_pb2.Progress(**answer["progress"]),
        materialized=None if made is None else graphs_pb2.Materialized(
            versions=made["versions"], run_ids=made["run_ids"], skipped=made["skipped"],
            checks=[graphs_pb2.Materialized.CheckResult(**c) for c in made["checks"]]))


def _operation_messages(answer: dict, limits):
    """The operation (outputs' headers, with their bytes while together they fit one
    message), then the chunks of the others."""
    outputs = answer.pop("outputs", None) or {}
    headers, pending, room = [], [], limits.max_message_bytes - HEADER_SLACK
    for index, (name, array) in enumerate(outputs.items()):
        # (a running total, not each tensor alone: two of 3 MB make no 6 MB message)
        inline = array.nbytes <= room
        message = tensors.to_message(name, array, None if inline else -1)
        headers.append(message)
        if inline:
            room -= array.nbytes
        else:
            pending.append((index, array))
    yield graphs_pb2.ExecuteGraphResponse(operation=_operation(answer, headers))
    for index, array in pending:
        for tensor, offset, data in tensors.chunks(index, tensors.to_raw(array),
                                                    limits.max_chunk_bytes):
            yield graphs_pb2.ExecuteGraphResponse(output_chunk=tensor_pb2.TensorChunk(
                tensor=tensor, offset=offset, data=bytes(data)))


class CatalogService(catalog_pb2_grpc.CatalogServiceServicer):
    """The catalog's calls: runs, assets, the registry."""

    def __init__(self, gateway):
        self.gateway = gateway

    async def ListRuns(self, request, context):
        answer = await called(context, self.gateway.runs, request.status or None,
                               request.limit or None)
        return catalog_pb2.ListRunsResponse(runs=[catalog_pb2.Run(**r) for r in answer["runs"]])

    async def GetRun(self, request, context):
        return catalog_pb2.Run(**await called(context, self.gateway.run, request.id))

    async def ListAssets(self, request, context):
        answer = await called(context, self.gateway.assets.assets)
        return catalog_pb2.ListAssetsResponse(assets=[_asset(a) for a in answer["assets"]])

    async def ListAssetVersions(self, request, context):
        answer = await called(context, self.gateway.assets.versions, request.name)
        return catalog_pb2.ListAssetVersionsResponse(
            versions=[catalog_pb2.AssetVersion(**v) for v in answer["versions"]])

    async def DefineAsset(self, request, context):
        axis = request.partition_axis if request.HasField("partition_axis") else None
        answer = await called(
            context, self.gateway.assets.define, request.name, request.graph_json,
            list(request.dependencies), request.description, list(request.partitions), axis,
            [_check_of(c) for c in request.checks])
        return _asset(answer)

    async def MaterializeAsset(self, request, context):
        wait = request.wait_seconds if request.HasField("wait_seconds") else None
        answer = await awaited(context, self.gateway.materialize(
            request.name, list(request.partitions) or None, request.force, wait,
            request.operation_id or None, request.upstream))
        for message in _operation_messages(answer, self.gateway.limits):
            yield message

    async def ReadAsset(self, request, context):
        limits, ref = self.gateway.limits, request.asset
        ranges = [[r.start, r.stop] for r in request.slice] or None
        array = await called(context, self.gateway.assets.read, ref.name, ref.version,
                              ref.partition, ranges)
        header = tensors.to_message(ref.name, array, limits.max_message_bytes - HEADER_SLACK)
        yield catalog_pb2.ReadAssetResponse(tensor=header)
        if header.streamed:
            for tensor, offset, data in tensors.chunks(0, tensors.to_raw(array),
                                                        limits.max_chunk_bytes):
                yield catalog_pb2.ReadAssetResponse(chunk=tensor_pb2.TensorChunk(
                    tensor=tensor, offset=offset, data=bytes(data)))

    async def GetRegistry(self, request, context):
        answer = await called(context, self.gateway.registry)
        return catalog_pb2.Registry(
            workers=[catalog_pb2.Registry.Worker(**w) for w in answer["workers"]],
            links=[catalog_pb2.Registry.Link(**k) for k in answer["links"]],
            storage_tiers=answer["storage_tiers"])


def _asset(answer: dict) -> catalog_pb2.Asset:
    return catalog_pb2.Asset(**{**answer, "checks": [catalog_pb2.AssetCheck(**c)
                                                     for c in answer["checks"]]})


def _check_of(message) -> dict:
    """An AssetCheck message in the contract's JSON form (what the HTTP mirror takes)."""
    check = {"kind": message.kind}
    for bound in ("low", "high", "blocking"):
        if message.HasField(bound):
            check[bound] = getattr(message, bound)
    if message.kind == "shape":
        check["shape"] = list(message.shape)
    elif message.shape:
        check["shape"] = list(message.shape)  # refused, as over HTTP: kind takes no shape
    return check


class _Authenticated(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for a call whose `authorization` metadata `creds` does not allow."""

    def __init__(self, creds):
        self.creds = creds

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "unauthenticated: this gateway needs a bearer token or a "
                                "user and password")
        self._refusals = {
            (False, False): grpc.unary_unary_rpc_method_handler(refuse),
            (True, False): grpc.stream_unary_rpc_method_handler(refuse),
            (False, True): grpc.unary_stream_rpc_method_handler(refuse),
            (True, True): grpc.stream_stream_rpc_method_handler(refuse)}

    async def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get("authorization")
        if self.creds.allows(given):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return None
        return self._refusals[(handler.request_streaming, handler.response_streaming)]


def make_server(gateway, creds=None) -> grpc.aio.Server:
    """A grpc.aio server with the contract's services of `gateway` and the Open Inference
    Protocol's (ports are added by the caller); calls `creds` does not allow are
    UNAUTHENTICATED."""
    limit = gateway.limits.max_message_bytes
    server = grpc.aio.server(
        interceptors=[_Authenticated(creds)] if creds is not None and creds.required else [],
        options=[("grpc.max_receive_message_length", limit),
                 ("grpc.max_send_message_length", limit)])
    graphs_pb2_grpc.add_GraphServiceServicer_to_server(GraphService(gateway), server)
    catalog_pb2_grpc.add_CatalogServiceServicer_to_server(CatalogService(gateway), server)
    from deepx_flow.gateway.oip_grpc import InferenceService, add_to_server
    add_to_server(InferenceService(gateway), server)
    return server
