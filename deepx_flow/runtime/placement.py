"""`dx.placement(tensor)`: which worker holds each chunk of a tensor, from the metadata DB."""

from __future__ import annotations

from dataclasses import dataclass

from deepx_flow.ir import Node
from deepx_flow.ir.keys import key_base
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.models import ChunkPlacement
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.text_table import text_table


@dataclass
class Placement:
    """Chunk placements of one tensor: `rows` (ChunkPlacement), printed as a table. For a
    `dx.persist` result, `chunks` is how many it has and `pending` how many of them were
    still being computed when asked."""

    tensor: str | None
    rows: list[ChunkPlacement]
    chunks: int | None = None
    pending: int = 0

    def __len__(self) -> int:
        return len(self.rows)

    def note(self) -> str:
        """What the table cannot show: chunks not computed yet, or nothing recorded."""
        if self.pending:
            return (f"{self.pending} of {self.chunks} chunks are still being computed: "
                    "p.wait() waits for them, or ask again later")
        if not self.rows:
            return ("no chunk of it is recorded: it has not been run with recording on "
                    "(dx.persist or dx.run it; DEEPX_RECORD=0 records nothing)")
        return ""

    def __str__(self) -> str:
        table = placement_table(self.rows, f"placement of {self.tensor or '-'}")
        note = self.note()
        return table + (f"\n{note}" if note else "")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        from deepx_flow.text_table import html_table
        note = self.note()
        return html_table(*_placement_rows(self.rows), f"placement of {self.tensor or '-'}") \
            + (f"<p>{html.escape(note)}</p>" if note else "")


def placement(tensor, db: str | None = None, current: bool = True) -> Placement:
    """Where each chunk of `tensor` is: a `dx.persist` result, a Tensor (its latest run),
    or a tensor key. With `current=False`, also chunks released or lost."""
    from deepx_flow.runtime.run import Persisted

    database = open_db(db)
    if isinstance(tensor, Persisted):
        if tensor.recorder is not None:  # write what the scheduler saw so far
            tensor.recorder.flush_quietly()
        rows = queries.placements(database, tensor=tensor.key, current=current)
        pending = sum(f.status == "pending" for f in tensor.futures)
        return Placement(tensor.key, rows, len(tensor.futures), pending)
    node = getattr(tensor, "node", None)  # a dx.Tensor (the runtime knows its node only)
    if isinstance(node, Node):
        rows = queries.placements(database, node_key=key_base(node.id, node.op),
                                  current=current)
        return Placement(rows[0].tensor if rows else None, rows)
    rows = queries.placements(database, tensor=str(tensor), current=current)
    return Placement(str(tensor), rows)


def _placement_rows(rows) -> tuple[tuple, list]:
    return (("tensor", "chunk", "worker", "device", "tier", "bytes", "state"),
            [(r.tensor, r.chunk, r.worker, r.device or "-", r.tier,
              format_bytes(r.nbytes) if r.nbytes is not None else "-", r.state)
             for r in rows])


def placement_table(rows, title: str | None = None) -> str:
    return text_table(*_placement_rows(rows), title)
