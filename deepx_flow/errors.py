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
    strings keep their start and end (`'nnn...nnn'`), containers their first items; an
    object printed on several lines is printed on one.
    """
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother, short.maxlong = 3, limit, limit, limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 6
    try:
        text = short.repr(value)
    except ValueError:  # an int too long for Python to print
        return f"<an integer of {value.bit_length():,} bits>"
    if "\n" in text:  # an object printed on several lines (a NumPy array): a message is one
        text = " ".join(line.strip() for line in text.splitlines())
    if len(text) > limit + 10:  # items that are long themselves
        text = text[:limit // 2] + "..." + text[-(limit // 2):]
    return text


def closest(word: Any, choices) -> str | None:
    """The choice spelled most like `word`, ignoring case (difflib's ratio, at least 0.6), or
    None: the "did you mean" of messages."""
    import difflib
    lowered = {}
    for choice in map(str, choices):
        lowered.setdefault(choice.lower(), choice)
    close = difflib.get_close_matches(str(word).lower(), list(lowered), n=1)
    return lowered[close[0]] if close else None


def did_you_mean(word: Any, choices) -> str:
    """`" (did you mean 'relu'?)"` for the choice closest to `word`, or "" when none is."""
    close = closest(word, choices)
    return f" (did you mean {close!r}?)" if close is not None else ""


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
    """A run was given inputs that do not match the graph (missing, wrong shape, unreadable),
    or a call an argument it cannot use (a wrong type, a value out of range)."""

    exit_code = 2


class DataError(InputError):
    """Stored data is missing or damaged: a chunk absent, of the wrong size, or failing its
    checksum, or the whole stored array gone. `uri` and `chunk` (the stored chunk index) say
    where, `problem` what (e.g. "chunk (0, 1) is missing"); for a stored asset version
    `asset`, `version` and `partition` say which. Nothing computed from such data is
    returned or published."""

    def __init__(self, message: str, *, uri: str | None = None, chunk: tuple | None = None,
                 problem: str | None = None, asset: str | None = None,
                 version: str | None = None, partition: str | None = None):
        super().__init__(message)
        self.uri, self.chunk, self.problem = uri, chunk, problem or message
        self.asset, self.version, self.partition = asset, version, partition


class SettingsError(DeepxError):
    """A `DEEPX_*` environment variable holds a value its setting does not allow
    (`deepx_flow/config.py`)."""

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
    "oom", "device-lost", "killed-worker", "timeout", "no-workers" or "codegen"."""

    exit_code = 1
    kind: str | None = None


class CodegenError(ExecutionError):
    """Generating or compiling the code of a fused kernel failed. It is a limit or a gap of
    the code generator (or of the compiler it feeds), not of the data: planning smaller chunks
    would fail the same way, so it is never taken for running out of memory."""

    kind = "codegen"


class CheckFailed(DeepxError):
    """A blocking asset check failed: the checked version is recorded but not used, and the
    assets downstream of it were not materialized. `materialized` is what was stored."""

    exit_code = 1

    def __init__(self, message: str, materialized=None):
        super().__init__(message)
        self.materialized = materialized


class UnknownNameError(DeepxError, AttributeError):
    """A name that `dx`, `dx.nn`, `dx.random`, `dx.optim` or a Tensor does not have. It is
    an AttributeError too, so `hasattr` and `getattr(obj, name, default)` work as ever."""

    exit_code = 2


def no_attribute(owner: str, name: Any, choices) -> UnknownNameError:
    """The error for `owner.name` that does not exist, saying which public name of
    `choices` was meant: `dx has no attribute 'reul'; did you mean dx.relu?`."""
    message = f"{owner} has no attribute {shown(name)}"
    if isinstance(name, str) and not name.startswith("_"):  # hasattr's probes of dunders
        close = closest(name, [c for c in choices if not str(c).startswith("_")])
        if close is not None:
            message += f"; did you mean {owner}.{close}?"
    return UnknownNameError(message)
