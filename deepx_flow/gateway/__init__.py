"""The gateway (`deepx-flow serve`): the wire contract of `proto/deepx/v1` served over gRPC
and its HTTP/JSON mirror, on a cluster, for clients in any language.

Layers, top to bottom: the transports (`http_app`, `grpc_server`) turn requests into calls
of the transport-free handlers (`capabilities`, `graphs`, ...), which call the same runtime
entry points as the Python SDK and the CLI; `contract.tensors` is the one tensor codec.
"""
