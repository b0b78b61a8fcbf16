"""Running a small graph in this process, without a scheduler: what a served model does
for each batch of requests, where a round trip through the cluster's scheduler would cost
more than the model.

The graph is compiled for `cluster` as any run's is (the plan cache keeps one plan per
graph, so each batch size compiles once), lowered over the bound inputs, and its tasks run
in this thread in dependency order by `dask.core.get`, Dask's simplest executor (a third of
`dask.local.get_sync`'s overhead for a one-row request; it keeps every result until the
end, which a batch can afford: a request too large for one task goes to the cluster as a
chunked plan instead, `repository.py`); each output is assembled from its chunks.
"""

from __future__ import annotations

import itertools

import numpy as np

from deepx_flow.errors import DeepxError, ExecutionError


def run_here(graph, sources: dict, cluster) -> dict[str, np.ndarray]:
    """The outputs (name -> array) of `graph` (checked and typed) over `sources` (as
    `bind_inputs` gives them), computed in this thread."""
    from dask.core import get

    from deepx_flow.runtime.plan_cache import cached_compile
    plan = cached_compile(graph, cluster)
    lowered = plan.lower(sources, to_host=False)
    keys = {name: lowered.output_keys(name) for name, _ in graph.outputs}
    try:
        values = get(lowered.dsk, [k for ks in keys.values() for k in ks])
    except DeepxError:
        raise
    except Exception as err:  # a kernel's failure: said, with its kind
        raise ExecutionError(f"a task failed: {type(err).__name__}: {err}") from err
    out, at = {}, 0
    for name, node_id in graph.outputs:
        node = plan.graph[node_id]
        chunks = lowered.outputs[name][1]
        out[name] = _assembled(values[at:at + len(keys[name])], node.shape, node.dtype, chunks)
        at += len(keys[name])
    return out


def _assembled(parts, shape, dtype, chunks) -> np.ndarray:
    if len(parts) == 1:
        return np.asarray(parts[0], dtype=dtype).reshape(shape)
    out = np.empty(shape, dtype=dtype)
    starts = [tuple(itertools.accumulate((0,) + c[:-1])) for c in chunks]
    for part, idx in zip(parts, itertools.product(*(range(len(c)) for c in chunks))):
        out[tuple(slice(s[i], s[i] + c[i]) for s, c, i in zip(starts, chunks, idx))] = part
    return out
