"""Parameters in pieces: where each piece of a split parameter and of its optimizer state
lives while `dx.train` runs, and how the pieces get there.

The placement pass (`compiler/placing`) splits a parameter that does not fit replicated
along one axis, one piece per worker (`StepPlan.splits`), and the step is compiled with
that axis in those pieces: every task of the step reads and writes pieces (a matmul's K in
pieces gives partial products, tree-summed), never the whole tensor. Piece i of every split
tensor lives on worker i, the workers in address order: the starting values are sent there
piece by piece, and the tasks computing a step's new pieces are placed there, so a worker
keeps its pieces from step to step. Where a step's other tasks run is Dask's choice (beside
the larger of what they read).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from deepx_flow.ir.keys import key_name, node_of
from deepx_flow.runtime.inputs import KeySource, region_block

Chunks = tuple[tuple[int, ...], ...]

SEND_TIMEOUT_S = 10.0  # for a worker to take its pieces (one paused waits until it resumes)
SEND_ATTEMPTS = 5      # dealing the pieces again to the workers running then, after each


def running_workers(client) -> list[str]:
    """The addresses of the workers that are running (not paused, closing or gone), asked
    of the scheduler (`scheduler_info`'s cache can be read empty)."""
    from deepx_flow.registry.live import scheduler_workers
    return [address for address, w in scheduler_workers(client).items()
            if w.get("status", "running") == "running"]


@dataclass(frozen=True)
class Pieces:
    """The split inputs of a step plan and the workers their pieces live on."""

    splits: dict[str, tuple[int, int]]  # input id -> (axis, pieces)
    chunks: dict[str, Chunks]           # input id -> its chunks in the step's plan
    workers: tuple[str, ...]            # addresses, sorted

    @classmethod
    def of(cls, plan, splits: dict, workers) -> "Pieces":
        return cls(dict(splits), {i: plan.partition.chunks[i] for i in splits},
                   tuple(sorted(workers)))

    def on(self, workers) -> "Pieces":
        """The same pieces dealt to `workers` (after one was lost)."""
        return Pieces(self.splits, self.chunks, tuple(sorted(workers)))

    def owner(self, input_id: str, index: tuple[int, ...]) -> str:
        """The worker of chunk `index` of a split input: chunks along the split axis are
        dealt to the workers in order (several each, where memory cut them smaller)."""
        axis, _ = self.splits[input_id]
        n = len(self.chunks[input_id][axis])
        return self.workers[index[axis] * len(self.workers) // n]

    def send(self, client, input_id: str, array: np.ndarray, key: str
             ) -> tuple[KeySource, list]:
        """Send `array`'s chunks, each to its worker, as the keys `(key, *index)`; the
        source that reads them and their futures (which keep them on the cluster)."""
        chunks = self.chunks[input_id]
        starts = [np.cumsum((0,) + c) for c in chunks]
        by_worker: dict[str, dict] = {}
        for index in itertools.product(*(range(len(c)) for c in chunks)):
            region = tuple((int(s[i]), int(s[i + 1])) for s, i in zip(starts, index))
            by_worker.setdefault(self.owner(input_id, index), {})[(key, *index)] = \
                region_block(array, region)
        futures = []
        try:
            for worker, data in by_worker.items():
                # Through the scheduler, which refuses a worker that is gone or paused (its
                # memory full) after `timeout` instead of waiting for it.
                futures += list(client.scatter(data, workers=[worker], hash=False,
                                               direct=False, timeout=SEND_TIMEOUT_S).values())
        except BaseException:
            for f in futures:
                f.release()
            raise
        return KeySource(key, chunks, array.dtype.name), futures

    def placement(self, lowered, sources: dict) -> dict:
        """Key -> worker: the tasks that compute a step's new pieces (the outputs
        `new_<input>`) on the pieces' workers, and every task that reads pieces of one
        worker only on that worker, so pieces are read where they are and never copied
        (the partial results move instead, as in tensor parallelism). A task reading the
        pieces of several workers (a sharded parameter's gather) runs where Dask puts it.
        `sources` are the inputs the step was lowered with."""
        out, pieces = {}, {}
        for input_id in self.splits:
            key, chunks = lowered.outputs["new_" + input_id]
            source = sources.get(input_id)
            for index in itertools.product(*(range(len(c)) for c in chunks)):
                out[(key, *index)] = self.owner(input_id, index)
                if isinstance(source, KeySource):
                    pieces[(source.key, *index)] = self.owner(input_id, index)
        for key in lowered.dsk:
            input_id = node_of(key_name(key))
            if input_id in self.splits and len(key) == 1 + len(self.chunks[input_id]):
                pieces[key] = out[key] = self.owner(input_id, key[1:])
        for key, spec in lowered.dsk.items():
            owners = {pieces[d] for d in getattr(spec, "dependencies", ()) if d in pieces}
            if len(owners) == 1 and key not in out:
                out[key] = owners.pop()
        return out


def chunk_bytes(plan):
    """key -> the bytes of the chunk it computes in `plan` (0 for a key of no node)."""
    from deepx_flow.ir import dtypes
    chunks, graph = plan.partition.chunks, plan.fused

    def size(key) -> int:
        node_id = node_of(key_name(key)) if isinstance(key, tuple) else None
        grid = chunks.get(node_id)
        if grid is None or len(key) != 1 + len(grid):
            return 0
        n = 1
        for axis, i in enumerate(key[1:]):
            if not isinstance(i, int) or i >= len(grid[axis]):
                return 0
            n *= grid[axis][i]
        return n * dtypes.itemsize(graph[node_id].dtype)
    return size
