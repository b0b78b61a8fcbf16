"""What this server speaks, for a client to check before it builds anything: the protocol
version, the operator table and its hash, the limits on messages and graphs, the optional
parts (extensions) and the datatypes tensors may have.

The operator table is the one the spec reader checks graphs against and the SDKs are
generated from (`ops/operators.yaml`), and its hash is the SHA-256 of its canonical JSON (sorted keys, no spaces) without the
descriptions, which are for people (a reworded one changes no graph): an SDK
generated from the same table carries the same hash, so a client learns of a gap (an
operator its server lacks, an attribute it does not take) by comparing once, not when a
call fails.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from deepx_flow.contract import streams
from deepx_flow.contract.tensors import DATATYPES

PROTOCOL_VERSION = "deepx.v1"
# the optional parts served now (outputs written to storage by reference are in the
# contract, not served yet: a client must not build on them)
EXTENSIONS = ("binary_tensor_data", "tensor_streaming", "assets", "input_references")


@dataclass(frozen=True)
class Limits:
    """The gateway's bounds. gRPC's own default message limit is 4 MiB; a tensor whose
    bytes pass `max_message_bytes` is streamed in chunks of at most `max_chunk_bytes`."""

    max_message_bytes: int = streams.MESSAGE_BYTES
    max_chunk_bytes: int = streams.CHUNK_BYTES
    max_request_bytes: int = 1 << 30
    max_graph_nodes: int = 100_000
    # the JSON part of an HTTP request: parsed, its numbers take about ten times their
    # text's memory (large tensors travel as binary data)
    max_json_bytes: int = 64 << 20


def operator_table() -> list[dict]:
    """The operators a graph may use, as the contract describes them, by name: the operator
    table's (`ops/operators.yaml`, with DEEPX_EXTRA_OPERATORS' composites), primitives and
    composites alike (the spec reader expands a composite; the compiler's own operators,
    such as `fused`, are not a graph's to use). The SDKs are generated from the same table."""
    from deepx_flow.ops.table import operator_table as table
    return [{"name": op.name, "kind": op.kind,
             "arity": -1 if op.variadic else len(op.inputs),
             "attributes": [a.name for a in op.attrs],
             "required_attributes": [a.name for a in op.attrs if a.required],
             "declared": [s.name for s in op.states], "differentiable": op.differentiable,
             "description": op.doc}
            for op in sorted(table().values(), key=lambda op: op.name)]


def table_hash(table: list[dict]) -> str:
    """The SHA-256 of the table's canonical JSON without its descriptions, in hex."""
    bare = [{k: v for k, v in entry.items() if k != "description"} for entry in table]
    text = json.dumps(bare, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def capabilities(limits: Limits) -> dict:
    """The answer to `GET /v1/capabilities` (and GetCapabilities), as the contract's JSON."""
    from deepx_flow import __version__
    table = operator_table()
    return {"protocol_version": PROTOCOL_VERSION, "server_version": __version__,
            "operators": table, "operator_table_hash": table_hash(table),
            "limits": asdict(limits), "extensions": list(EXTENSIONS),
            "datatypes": list(DATATYPES)}
