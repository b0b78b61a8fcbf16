"""The two ends of an ExecuteGraph (or GetOperation) stream, for Python clients of the gRPC
contract: the requests that carry a graph and its inputs, those over the inline limit as
chunks after the header; and the operation and its outputs, reassembled from the answers."""

from __future__ import annotations

from typing import Iterable, Iterator

from deepx_flow.contract import tensors
from deepx_flow.contract.deepx.v1 import graphs_pb2, tensor_pb2
from deepx_flow.errors import InputError

MESSAGE_BYTES = 4 << 20  # gRPC's usual limit on one message
HEADER_SLACK = 64 << 10  # room for a message's fields beside its largest bytes
MAX_INLINE_BYTES = MESSAGE_BYTES - HEADER_SLACK
CHUNK_BYTES = 1 << 20


def execute_requests(graph_json: str, inputs: dict, max_inline: int = MAX_INLINE_BYTES,
                     chunk_bytes: int = CHUNK_BYTES, **header) -> Iterator:
    """ExecuteGraphRequests for `graph_json` on `inputs` (name -> array): the header, whose
    tensors each hold their bytes unless together they would pass `max_inline`, then the
    chunks of the others. `header` adds ExecuteGraphHeader fields (outputs, wait_seconds,
    operation_id)."""
    messages, streamed, room = [], [], max_inline
    for index, (name, array) in enumerate(inputs.items()):
        inline = array.nbytes <= room
        messages.append(tensors.to_message(name, array, None if inline else -1))
        if inline:
            room -= array.nbytes
        else:
            streamed.append((index, array))
    yield graphs_pb2.ExecuteGraphRequest(header=graphs_pb2.ExecuteGraphHeader(
        graph_json=graph_json, inputs=messages, **header))
    for index, array in streamed:
        for tensor, offset, data in tensors.chunks(index, tensors.to_raw(array), chunk_bytes):
            yield graphs_pb2.ExecuteGraphRequest(input_chunk=tensor_pb2.TensorChunk(
                tensor=tensor, offset=offset, data=bytes(data)))


def operation_outputs(answers: Iterable) -> tuple:
    """(the Operation, its outputs by name as arrays) from an ExecuteGraph or GetOperation
    answer stream."""
    answers = iter(answers)
    first = next(answers, None)
    if first is None or first.WhichOneof("part") != "operation":
        raise InputError("the answer does not start with the operation")
    operation = first.operation
    sizes = {i: (t.name, tensors.byte_size(t.datatype, t.shape, t.name))
             for i, t in enumerate(operation.outputs) if t.streamed}
    assembler = tensors.Assembler(sizes)
    for answer in answers:
        chunk = answer.output_chunk
        assembler.add(chunk.tensor, chunk.offset, chunk.data)
    received = assembler.finish()
    return operation, {t.name: tensors.from_message(t, received.get(i))
                       for i, t in enumerate(operation.outputs)}
