"""`dx.placement(tensor)`: which worker holds each chunk of a tensor, from the metadata DB."""

from __future__ import annotations

from dataclasses import dataclass

from deepx_flow.meta import open_db, queries
from deepx_flow.meta.models import ChunkPlacement
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.sdk.tensor import Tensor
from deepx_flow.text_table import text_table


@dataclass
class Placement:
    """Chunk placements of one tensor: `rows` (ChunkPlacement), printed as a table."""

    tensor: str | None
    rows: list[ChunkPlacement]

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        return placement_table(self.rows, f"placement of {self.tensor or '-'}")

    __repr__ = __str__


def placement(tensor, db: str | None = None, current: bool = True) -> Placement:
    """Where each chunk of `tensor` is: a `dx.persist` result, a Tensor (its latest run),
    or a tensor key. With `current=False`, also chunks released or lost."""
    from deepx_flow.runtime.run import Persisted

    database = open_db(db)
    if isinstance(tensor, Persisted):
        if tensor.recorder is not None:  # write what the scheduler saw so far
            tensor.recorder.flush_quietly()
        rows = queries.placements(database, tensor=tensor.key, current=current)
        return Placement(tensor.key, rows)
    if isinstance(tensor, Tensor):
        rows = queries.placements(database, node_id=tensor.node.id, current=current)
        return Placement(rows[0].tensor if rows else None, rows)
    rows = queries.placements(database, tensor=str(tensor), current=current)
    return Placement(str(tensor), rows)


def placement_table(rows, title: str | None = None) -> str:
    return text_table(
        ("tensor", "chunk", "worker", "device", "tier", "bytes", "state"),
        [(r.tensor, r.chunk, r.worker, r.device or "-", r.tier,
          format_bytes(r.nbytes) if r.nbytes is not None else "-", r.state) for r in rows],
        title)
