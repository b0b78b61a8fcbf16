"""How a gRPC servicer of the gateway (the contract's, `grpc_server.py`; the Open Inference
Protocol's, `oip_grpc.py`) carries out a call: the work in a thread or awaited, and a
DeepxError ending the call with its status code, its text, and its kind in the trailing
metadata (`deepx-error-kind`, as HTTP's "kind")."""

from __future__ import annotations

import asyncio

import grpc

from deepx_flow.errors import DeepxError
from deepx_flow.gateway.errors import NotFound, TooLarge


def code_of(err: DeepxError) -> grpc.StatusCode:
    if isinstance(err, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(err, TooLarge):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INVALID_ARGUMENT if err.exit_code == 2 else \
        grpc.StatusCode.INTERNAL


async def called(context, call, *args):
    """`call(*args)` in a thread; its DeepxError aborts the call with its code and text."""
    return await awaited(context, asyncio.to_thread(call, *args))


async def awaited(context, pending):
    """What `pending` (a coroutine) gives; its DeepxError aborts the call with its code
    and text."""
    try:
        return await pending
    except DeepxError as err:
        await abort_with(context, err)


KIND_KEY = "deepx-error-kind"  # (trailing metadata: the error's kind, as HTTP's "kind")


async def abort_with(context, err: DeepxError) -> None:
    """End the call with `err`'s status code and text, its kind in the trailing metadata."""
    context.set_trailing_metadata(((KIND_KEY, type(err).__name__),))
    await context.abort(code_of(err), str(err))
