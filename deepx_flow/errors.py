"""The one exception family of deepx_flow.

Every error a user can cause or meet derives from `DeepxError`. Messages name the node, the
shapes or the file involved and say what to do. The command line maps the families onto exit
codes: bad input (a graph, an input file, an option, a plan that cannot fit) exits 2, a failure
while running exits 1.
"""

from __future__ import annotations

import reprlib
from typing import Any

# How much of a value a message shows: enough to recognise it, never a whole structure.
SHOWN_CHARS = 60


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` cut to about `limit` characters, for messages.

    A spec can hold a mapping of a million entries or an id of a million characters where
    a number belongs; a message that printed them whole would be megabytes long. Long
    strings keep their start and end (`'nnn...nnn'`), containers their first items.
    """
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother, short.maxlong = 3, limit, limit, limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 6
    try:
        text = short.repr(value)
    except ValueError:  # an int too long for Python to print
        return f"<an integer of {value.bit_length():,} bits>"
    if len(text) > limit + 10:  # items that are long themselves
        text = text[:limit // 2] + "..." + text[-(limit // 2):]
    return text


class DeepxError(Exception):
    """Base of every deepx_flow error."""

    exit_code = 1


class GraphError(DeepxError):
    """A graph is malformed: unknown operator, cycle, shape or dtype mismatch, bad attribute."""

    exit_code = 2

    def __init__(self, message: str, node: str | None = None):
        self.node = node
        super().__init__(f"node {shown(node)}: {message}" if node else message)


class SpecError(GraphError):
    """A YAML graph spec cannot be read: bad YAML, wrong version, wrong field types."""


class InputError(DeepxError):
    """A run was given inputs that do not match the graph: missing, wrong shape, unreadable."""

    exit_code = 2


class ClusterError(DeepxError):
    """A cluster description (file or live cluster) cannot be used."""

    exit_code = 2


class PlanError(DeepxError):
    """No chunking of the graph fits the memory budget of the cluster."""

    exit_code = 2


class DatabaseError(DeepxError):
    """The metadata database cannot be opened: a bad URL, no server, or a schema this code
    does not know (written by a newer deepx_flow)."""

    exit_code = 2


class ExecutionError(DeepxError):
    """A task failed while running on the cluster. `kind` says how when it is known:
    "oom", "device-lost", "killed-worker", "timeout" or "no-workers"."""

    exit_code = 1
    kind: str | None = None


class CheckFailed(DeepxError):
    """A blocking asset check failed: the checked version is recorded but not used, and the
    assets downstream of it were not materialized. `materialized` is what was stored."""

    exit_code = 1

    def __init__(self, message: str, materialized=None):
        super().__init__(message)
        self.materialized = materialized
