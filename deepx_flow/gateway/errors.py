"""The gateway's own kinds of bad request, beside deepx_flow's errors: each transport turns
them into its status (HTTP 404 and 413, gRPC NOT_FOUND and RESOURCE_EXHAUSTED)."""

from __future__ import annotations

from deepx_flow.errors import InputError


class NotFound(InputError):
    """A named thing the request refers to (an operation, a run, an asset) does not exist."""


class TooLarge(InputError):
    """A request, or a tensor in it, over the gateway's limits."""
