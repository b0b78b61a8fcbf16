"""Reading the Dask keys the lowering makes: `(tensor key, *chunk index)`, where a tensor
key is `node id@content token`, with a suffix for a task's internal steps ("...@tok.partial").

One place for it: the recorder, the supervisor, retry annotations and the fault engine all
need a key's tensor or node, and must agree.
"""

from __future__ import annotations


def key_name(key) -> str:
    """The tensor key (or internal step) of a task key."""
    return key[0] if isinstance(key, tuple) else str(key)


def node_of(key) -> str:
    """The id of the node a task key computes."""
    return key_name(key).split("@")[0]


def chunk_index(key) -> str:
    """The chunk index of a task key, comma-separated ("0,1"); "" for a key without one."""
    return ",".join(str(i) for i in key[1:]) if isinstance(key, tuple) else ""
