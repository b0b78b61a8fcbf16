"""The Dask keys the lowering makes: `(tensor key, *chunk index)`, where a tensor key is
`name@content token`, with a suffix for a task's internal steps ("...@tok.partial").

The name starts with the operator, because Dask groups tasks by that first word (its "task
prefix") and keeps per-prefix statistics: a generated id (`mul-3fa2b1c9d0e4`) already does; a
name the user gave is written `op-_name` (`input-_x0`). Keying 5,000 named inputs by their own
names made 5,000 prefixes, and the scheduler's per-prefix bookkeeping made the run quadratic.

One place for it: the recorder, the supervisor, retry annotations and the fault engine all
need a key's tensor or node, and must agree.
"""

from __future__ import annotations

import re


def key_name(key) -> str:
    """The tensor key (or internal step) of a task key."""
    return key[0] if isinstance(key, tuple) else str(key)


# An id the SDK or a compiler pass generated: an operator, "-", a content hash. A fused node
# keeps the generated id of the node it grew from ("mul-..."), and its tasks keep that prefix.
_GENERATED = re.compile(r"[A-Za-z][A-Za-z0-9_]*-[0-9a-f]{12}")


def key_base(node_id: str, op: str) -> str:
    """What every tensor key of node `node_id` (operator `op`) has before its "@"."""
    return node_id if _GENERATED.fullmatch(node_id) else f"{op}-_{node_id}"


def tensor_key(node_id: str, op: str, token: str) -> str:
    """The tensor key of node `node_id` (operator `op`) whose content token is `token`."""
    return f"{key_base(node_id, op)}@{token}"


def node_of(key) -> str:
    """The id of the node a task key computes."""
    name = key_name(key).partition("@")[0]
    _, _, rest = name.partition("-")  # operator names have no "-"
    return rest[1:] if rest.startswith("_") else name


def chunk_index(key) -> str:
    """The chunk index of a task key, comma-separated ("0,1"); "" for a key without one."""
    return ",".join(str(i) for i in key[1:]) if isinstance(key, tuple) else ""
