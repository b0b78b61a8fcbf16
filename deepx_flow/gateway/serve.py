"""`deepx-flow serve`: the gateway, on an existing cluster (`--scheduler`, or
DEEPX_SCHEDULER) or this process's embedded one, until SIGTERM or Ctrl-C.

The HTTP mirror is served by uvicorn and the gRPC services by grpcio's asyncio server, in
one event loop (uvloop's, where it is installed: `run_event_loop`). Stopping is graceful:
both stop taking new calls and finish those in flight (up to 30 s) before the process
exits (operations still running are then interrupted by the next gateway to start,
`operations.py`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import sys
import threading
from pathlib import Path

from deepx_flow.errors import InputError
from deepx_flow.gateway import auth
from deepx_flow.gateway.capabilities import Limits

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
DEFAULT_RESULTS = Path(".deepx") / "operations"
SWITCH_INTERVAL_S = 0.0005  # (Python's default: 0.005; see serve())


def serve(address: str = DEFAULT_ADDRESS, http_port: int = DEFAULT_HTTP_PORT,
          grpc_port: int = DEFAULT_GRPC_PORT, scheduler: str | None = None,
          auth_token: str | None = None, basic_auth: str | None = None,
          tls_cert: str | None = None, tls_key: str | None = None,
          results: Path = DEFAULT_RESULTS, db: str | None = None,
          limits: Limits | None = None, ready=None, model_repository=None,
          metrics_port: int = DEFAULT_METRICS_PORT) -> None:
    """Serve the contract (and, with `model_repository`, its models over the Open Inference
    Protocol, their metrics on `metrics_port`) over HTTP and gRPC until stopped.
    `ready(http_port, grpc_port, metrics_port)` is called once all listen (tests start them
    on port 0)."""
    import asyncio

    import grpc
    import uvicorn
    from threadpoolctl import threadpool_limits

    from deepx_flow.gateway.grpc_server import make_server
    from deepx_flow.gateway.http_app import make_app, make_metrics_app
    from deepx_flow.gateway.direct_infer import direct_infer_http
    from deepx_flow.gateway.service import Gateway
    from deepx_flow.meta import open_db
    from deepx_flow.runtime.cluster import connect

    from deepx_flow.ops.table import operator_table
    operator_table()  # (an extra table of DEEPX_EXTRA_OPERATORS refused now, not per graph)
    creds = auth.credentials(auth_token, basic_auth)
    auth.check_bind(address, creds)
    if bool(tls_cert) != bool(tls_key):
        raise InputError("--tls-cert and --tls-key go together: give both, or neither")
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path and not Path(path).is_file():
            raise InputError(f"{flag} {path}: no such file")
    for flag, port in (("--http-port", http_port), ("--grpc-port", grpc_port),
                       ("--metrics-port", metrics_port)):
        if not 0 <= port <= 65535:
            raise InputError(f"{flag} {port} is not a port number (0 to 65535)")
    if model_repository is not None and not Path(model_repository).is_dir():
        raise InputError(f"--model-repository {model_repository}: not a folder")
    database = open_db(db)
    with connect(scheduler=scheduler) as client:
        models = None
        if model_repository is not None:
            from deepx_flow.runtime.run import cluster_spec
            from deepx_flow.serving.heap import retain_freed_memory
            from deepx_flow.serving.repository import ModelRepository
            models = ModelRepository(model_repository, cluster_spec(None, client), client)
            # Replicas in this process (KIND_CPU) each compute on one thread, so that their
            # count is the parallelism (Triton's instance_group): BLAS's own threads,
            # spinning beside two replicas and the event loop on 2 cores, made a batch of
            # 32 rows take 40 ms instead of 0.4. (Workers get this from their nannies.)
            threadpool_limits(1, user_api="blas")
            retain_freed_memory()  # (before the models' warm-up: their buffers stay)
            models.load_all()
            for m in models.index():  # the others serve; these are said once, here
                if m["state"] != "READY":
                    log.warning("deepx-flow serve: model %s is not served: %s", m["name"],
                                m["reason"])
        gateway = Gateway(client, database, Path(results), limits, models)
        # What the server holds from its start (the embedded cluster's scheduler, the
        # modules, the models) is never collected again: a full collection scanned it all
        # and stopped every request for 150 ms each second or so under load.
        gc.collect()
        gc.freeze()
        # The event loop holds the GIL but at its system calls; a thread that wants it (a
        # batch's replica thread, the Dask client's IO loop carrying a batch to a worker)
        # otherwise waits up to Python's 5 ms switch interval for it. At 64 clients of the
        # MLP on the workers, a 0.4 ms batch took 6.5 ms there and back that way, 5.3 with
        # this (4,000 to 4,800 requests/s); batches on the loop were not slower.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        # (proxy_headers off: nothing here reads a client's address, and uvicorn's
        # middleware for X-Forwarded-For cost every request 3% of the event loop's time;
        # the protocol answers a small infer request itself, without an ASGI cycle,
        # direct_infer.py, and each answer's headers and body in one send, one_send.py)
        config = uvicorn.Config(make_app(gateway, creds), host=address, port=http_port,
                                log_level="warning", ssl_certfile=tls_cert,
                                ssl_keyfile=tls_key, timeout_graceful_shutdown=30,
                                proxy_headers=False,
                                http=direct_infer_http(gateway, creds))
        http_server = uvicorn.Server(config)
        metrics_server = uvicorn.Server(uvicorn.Config(
            make_metrics_app(gateway, creds), host=address, port=metrics_port,
            log_level="warning", ssl_certfile=tls_cert, ssl_keyfile=tls_key))

        async def both():
            grpc_server = make_server(gateway, creds)
            host = f"[{address}]" if ":" in address and not address.startswith("[") \
                else address  # an IPv6 address is bracketed before its port
            target = f"{host}:{grpc_port}"
            if tls_cert:
                pair = (Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())
                bound = grpc_server.add_secure_port(
                    target, grpc.ssl_server_credentials([pair]))
            else:
                bound = grpc_server.add_insecure_port(target)
            await grpc_server.start()
            if ready is not None:
                _call_when_started([http_server, metrics_server],
                                   lambda http, metrics: ready(http, bound, metrics))

            async def stop_with_http():
                # as soon as uvicorn is told to stop: gRPC stops taking calls too, and the
                # running operations are cancelled, so that the calls waiting on them end
                # within the grace uvicorn and gRPC give those in flight (30 s)
                while not http_server.should_exit:
                    await asyncio.sleep(0.1)
                metrics_server.should_exit = True
                await asyncio.gather(grpc_server.stop(grace=30),
                                     asyncio.to_thread(gateway.operations.stop))
            stopping = asyncio.create_task(stop_with_http())
            beating = asyncio.create_task(_heartbeats(gateway.operations, models,
                                                      database))
            metrics = asyncio.create_task(metrics_server.serve())
            try:
                await http_server.serve()
            finally:
                http_server.should_exit = True
                beating.cancel()
                await stopping
                await metrics

        try:
            with _stopped_by_signals():
                run_event_loop(both())
        finally:
            if models is not None:
                models.stop()  # the servers answered what they took; the batchers end


def run_event_loop(main):
    """Run the coroutine `main` to its end on a new event loop: uvloop's (libuv's), where
    it is installed, else asyncio's own. The gateway's one loop reads every request and
    writes every answer: at 64 clients of the conv net, uvloop's took it from 6,300 to
    6,900 requests/s (6,700 to 7,300 in a second pair of runs) on this machine."""
    try:
        import uvloop
    except ImportError:  # (not built for this platform: Windows)
        import asyncio
        return asyncio.run(main)
    return uvloop.run(main)


async def _heartbeats(operations, models=None, db=None) -> None:
    """Every DEEPX_HEARTBEAT_S: say this gateway's operations still run, mark those of
    gateways gone silent (on any host) interrupted, forget those that ended longer ago
    than DEEPX_OPERATION_TTL_S, and record the models served (`serving/records.py`)."""
    import asyncio

    from deepx_flow.config import settings
    from deepx_flow.serving.records import record
    while True:
        if models is not None:
            try:
                await asyncio.to_thread(record, models, db)
            except Exception:  # a busy database: the next beat tries again
                log.warning("deepx-flow serve: recording the models failed", exc_info=True)
        await asyncio.sleep(settings().heartbeat_s)
        try:
            await asyncio.to_thread(operations.beat)
            await asyncio.to_thread(operations.interrupt_orphaned)
            await asyncio.to_thread(operations.prune)
        except Exception:  # a busy database: the next beat tries again
            log.warning("deepx-flow serve: a heartbeat failed", exc_info=True)


class _Stop(Exception):
    """SIGTERM or SIGINT, once uvicorn has shut down gracefully."""


@contextlib.contextmanager
def _stopped_by_signals():
    """Let SIGTERM and SIGINT end the serving block as a normal return. uvicorn takes both
    while it serves, shuts down gracefully, then raises the signal again with the handlers
    it found (by default: the process dies of it, before the cluster is closed); the
    handlers here make that a return, so the embedded cluster closes and the exit code
    is 0."""
    def stop(signum, frame):
        raise _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except _Stop:
        log.info("deepx-flow serve: stopped")
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _call_when_started(servers, ready) -> None:
    """`ready(port, ...)` with the port of each of `servers` (uvicorn's), once all listen."""
    import time

    def wait():
        while not all(s.started for s in servers) and not any(s.should_exit for s in servers):
            time.sleep(0.05)
        if all(s.started for s in servers):
            ready(*(s.servers[0].sockets[0].getsockname()[1] for s in servers))
    threading.Thread(target=wait, daemon=True).start()
