"""Read a lost chunk back from storage, or compute it again: pure decisions.

A materialization writes each chunk of a stored asset as soon as it is computed, and the
chunk stays in a worker's memory while later tasks of the run need it. When that worker
dies, Dask would compute the chunk again from its lineage, and with it every upstream chunk
that was lost too. Once the chunk's writes have finished, reading it back is the other way.

`decide` walks the lineage that would be computed again for a task Dask is about to run
again, and at each stored chunk in it compares:
- computing it again: the expected time of every task in its lost lineage (each task's
  node: the median of the run's finished tasks of that node, the operators' measured
  speed, or before three have finished the cost model's estimate);
- reading it back: a fixed cost to open the array plus its bytes at the rate the run's own
  writes reached (`StoreRate`; a default before the first write finished).

The supervisor (`supervisor.py`) feeds it the scheduler's state and rewrites the chunks it
chooses to read into reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterable

READ_OPEN_S = 0.005  # opening a Zarr array and its chunk before any byte arrives
DEFAULT_STORE_RATE = 200e6  # bytes/s assumed for storage before a write was measured
WALK_LIMIT = 10_000  # lineage tasks looked at per decision; a longer lineage costs more


@dataclass(frozen=True)
class Stored:
    """Where a chunk of a stored asset lies: `writes` are the tasks that store it (all must
    have finished), `path` the array and `region` its (start, stop) per axis."""

    writes: tuple
    path: str
    region: tuple


@dataclass(frozen=True)
class Choice:
    """For one lost stored chunk: read it back (`read`) or compute it again."""

    key: Hashable
    read: bool
    read_s: float
    recompute_s: float
    tasks: int  # tasks that computing it again would run

    @property
    def reason(self) -> str:
        again = f"computing it again runs {self.tasks} task{'s' * (self.tasks != 1)} " \
                f"(about {self.recompute_s:.3f} s)"
        read = f"reading it back about {self.read_s:.3f} s"
        return f"{read}; {again}" if self.read else f"{again}; {read}"


def stored_chunks(tensor_key: str, chunks, writes: dict, path: str) -> dict:
    """Chunk key `(tensor_key, *index)` -> `Stored`, for a tensor with plan chunks `chunks`
    written to `path` by the tasks `writes` (key -> task; a write's dependencies name the
    chunks it stores)."""
    from deepx_flow.compiler.lower import Grid
    grid = Grid(chunks)
    by_chunk: dict = {}
    for write_key, write in writes.items():
        for dep in write.dependencies:
            if isinstance(dep, tuple) and dep[0] == tensor_key:
                by_chunk.setdefault(dep, []).append(write_key)
    return {key: Stored(tuple(ws), path, grid.region(key[1:])) for key, ws in by_chunk.items()}


class StoreRate:
    """The speed of storage as the run's writes measured it: bytes over seconds."""

    def __init__(self):
        self.bytes = 0
        self.seconds = 0.0

    def add(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.bytes += nbytes
            self.seconds += seconds

    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else DEFAULT_STORE_RATE

    def read_seconds(self, nbytes: int) -> float:
        return READ_OPEN_S + nbytes / self.rate()


def nothing_to_write() -> int:
    """Task: a write whose result was lost after it finished; its chunk is stored already,
    so this attempt writes nothing (0 bytes)."""
    return 0


def lost_lineage(key, dependencies: Callable[[Hashable], Iterable], held: Callable,
                 limit: int = WALK_LIMIT) -> list:
    """`key` and every task it needs that no worker holds, following dependencies until a
    held one (at most `limit` keys)."""
    seen, order, todo = {key}, [key], [key]
    while todo and len(order) < limit:
        for dep in dependencies(todo.pop()):
            if dep not in seen and not held(dep):
                seen.add(dep)
                order.append(dep)
                todo.append(dep)
    return order


def decide(root, dependencies: Callable[[Hashable], Iterable], held: Callable,
           readable: Callable[[Hashable], bool], task_seconds: Callable[[Hashable], float],
           read_seconds: Callable[[Hashable], float], limit: int = WALK_LIMIT) -> list[Choice]:
    """The choices for the stored chunks in `root`'s lost lineage (`root` is about to be
    computed again). Below a chunk chosen to be read nothing more is looked at: it is not
    needed through that chunk."""
    choices, seen, todo = [], {root}, [root]
    while todo and len(seen) < limit:
        key = todo.pop()
        if readable(key):
            lineage = lost_lineage(key, dependencies, held, limit)
            read_s, recompute_s = read_seconds(key), sum(task_seconds(k) for k in lineage)
            choice = Choice(key, read_s < recompute_s, read_s, recompute_s, len(lineage))
            choices.append(choice)
            if choice.read:
                continue
        for dep in dependencies(key):
            if dep not in seen and not held(dep):
                seen.add(dep)
                todo.append(dep)
    return choices
