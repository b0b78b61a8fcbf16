"""`deepx-flow serve`: the gateway (`deepx_flow/gateway/serve.py`), the wire contract over
HTTP on 127.0.0.1:8000 and gRPC on 127.0.0.1:8001 unless told otherwise. Any other address than loopback needs
`--auth-token` (or DEEPX_GATEWAY_TOKEN) or `--basic-auth`; without one it refuses, exit
code 2."""

from __future__ import annotations

import os
import sys

from deepx_flow.gateway.serve import (DEFAULT_ADDRESS, DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT,
                                      DEFAULT_METRICS_PORT, DEFAULT_RESULTS)


def add_parser(sub, parents) -> None:
    p = sub.add_parser("serve", parents=parents,
                       help="serve the wire contract (graphs, operations) over HTTP and gRPC")
    p.add_argument("--address", default=DEFAULT_ADDRESS,
                   help=f"address to listen on (default {DEFAULT_ADDRESS}; any other needs "
                        f"--auth-token or --basic-auth)")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT,
                   help=f"HTTP port (default {DEFAULT_HTTP_PORT}; 0: any free one)")
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT,
                   help=f"gRPC port (default {DEFAULT_GRPC_PORT}; 0: any free one)")
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                   help=f"Prometheus metrics port (default {DEFAULT_METRICS_PORT}; 0: any "
                        f"free one)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="a running Dask scheduler (default DEEPX_SCHEDULER, else this "
                        "process's embedded cluster)")
    # an empty variable is unset, as for every DEEPX_* setting
    p.add_argument("--auth-token", default=os.environ.get("DEEPX_GATEWAY_TOKEN") or None,
                   help="require this bearer token (prefer DEEPX_GATEWAY_TOKEN: other users "
                        "can read a command line)")
    p.add_argument("--basic-auth", metavar="PASSWORD|FILE",
                   help="require a login: a JSON file of {user: password}, or a password")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="FILE", help="and this private key")
    p.add_argument("--results", default=str(DEFAULT_RESULTS), metavar="FOLDER",
                   help=f"where operations' outputs are kept (default {DEFAULT_RESULTS})")
    p.add_argument("--model-repository", metavar="DIR",
                   help="serve the models of this folder over the Open Inference Protocol "
                        "(Triton's layout: DIR/<model>/<version>/model.onnx)")


def run(args) -> int:
    from deepx_flow.gateway.serve import serve

    def ready(http_port, grpc_port, metrics_port):
        print(f"deepx-flow serve: HTTP on {args.address}:{http_port}, gRPC on "
              f"{args.address}:{grpc_port}, metrics on {args.address}:{metrics_port}",
              file=sys.stderr, flush=True)
    serve(address=args.address, http_port=args.http_port, grpc_port=args.grpc_port,
          scheduler=args.scheduler,
          auth_token=args.auth_token, basic_auth=args.basic_auth, tls_cert=args.tls_cert,
          tls_key=args.tls_key, results=args.results, db=args.db, ready=ready,
          model_repository=args.model_repository, metrics_port=args.metrics_port)
    return 0
