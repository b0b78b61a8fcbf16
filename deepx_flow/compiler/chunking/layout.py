"""Layout operators. Slicing and flipping read whatever grid their operand has (the lowering
assembles the region a task needs), so they set no operand's grid; nor do reshape and
concat, which join only the axes that keep their meaning. A transpose chunks its result as
its operand's axes, permuted."""

from __future__ import annotations

import math

from deepx_flow.compiler.chunking.classes import regular_chunks
from deepx_flow.compiler.chunking.rule import Rule
from deepx_flow.ir import dtypes


class Layout(Rule):
    sets_grid = False


class Transpose(Rule):
    def join(self, node, inputs, s, join_whole_axes):
        (t,) = inputs
        for i, j in enumerate(node.attr("axes")):
            s.classes.union((t.id, j), (node.id, i))


class Reshape(Layout):
    def join(self, node, inputs, s, join_whole_axes):
        # A chunk of whole rows along the first axis longer than 1 is a contiguous run of
        # elements: its task reads the operand rows around that run (see the lowering).
        # Runs of whole operand rows need nothing extra, so chunk sizes in multiples of
        # that many result rows are preferred while they fit.
        (t,) = inputs
        lead = _lead(node.shape)
        for axis in range(node.ndim):
            if axis != lead:
                s.classes.keep_whole((node.id, axis), f"'{node.id}' (reshape)")
        t_lead = _lead(t.shape)
        if t.ndim and node.ndim and t.shape[0] == node.shape[0] > 1:
            # the same rows in other shapes (a flatten of images): chunked alike, so a
            # task reads exactly its rows, and a chain of layers (`batch_chain`) runs
            # through the reshape
            s.classes.union((t.id, 0), (node.id, 0))
        elif lead is not None and t_lead is not None and node.size:
            row_out = math.prod(node.shape[lead + 1:])
            row_in = math.prod(t.shape[t_lead + 1:])
            s.classes.prefer((node.id, lead), math.lcm(row_out, row_in) // row_out)


def _lead(shape) -> int | None:
    """The first axis longer than 1."""
    for axis, extent in enumerate(shape):
        if extent > 1:
            return axis
    return None


class Concat(Layout):
    """Chunked like its operands off its axis. Along it, its chunks are its operands' chunks,
    runs of small ones joined (`join_pieces`, up to `min_chunk_bytes`)."""

    def join(self, node, inputs, s, join_whole_axes):
        axis = node.attr("axis")
        for t in inputs:
            for j in range(t.ndim):
                if j != axis:
                    s.classes.union((t.id, j), (node.id, j))

    def chunk_of(self, node, s):
        axis = node.attr("axis")
        return tuple(max(_longest_piece(node, axis, s), _merge_limit(node, axis, s)) if a == axis
                     else s.chunk((node.id, a)) for a in range(node.ndim))

    def task_keys(self, node, s):
        axis = node.attr("axis")
        return super().task_keys(node, s) + [(i, axis) for i in node.inputs]

    def chunk_counts(self, node, s, counts):
        axis = node.attr("axis")
        along = _joined_count(node.shape[axis], _merge_limit(node, axis, s),
                              [counts[i][axis] for i in node.inputs])
        return tuple(along if a == axis else c
                     for a, c in enumerate(super().chunk_counts(node, s, counts)))

    def chunks(self, node, s, chunks):
        axis = node.attr("axis")
        along = join_pieces(sum((chunks[i][axis] for i in node.inputs), ()),
                            _merge_limit(node, axis, s))
        return tuple(along if a == axis else regular_chunks(e, s.chunk((node.id, a)))
                     for a, e in enumerate(node.shape))


def _merge_limit(node, axis: int, s) -> int:
    """How long a run of small pieces one chunk of a concat may join along its axis: what
    the smallest chunk made for parallelism holds (`min_chunk_bytes`, the other axes at
    their chunk sizes), and no more than the concat's own class allows (memory fitting
    halves it). A chunk never splits a piece, so a longer piece is a chunk."""
    row = dtypes.itemsize(node.dtype) * math.prod(
        s.chunk((node.id, a)) for a in range(node.ndim) if a != axis)
    return max(1, min(s.chunk((node.id, axis)), s.config.min_chunk_bytes // max(1, row)))


def _longest_piece(node, axis: int, s) -> int:
    """The largest piece a concat joins along its axis: its operands' chunks, seen through
    concats along the same axis (whose chunks may join pieces up to their `_merge_limit`).
    The walk keeps its own stack (a chain of thousands of concats is deeper than Python's
    recursion limit) and stops at concats already measured since chunk sizes last changed,
    so the partitioner, which visits operands before users, measures a chain of n concats
    in O(n), not O(n^2)."""
    measured = s.memo("concat")
    if (node.id, axis) in measured:
        return measured[(node.id, axis)]
    largest, stack, seen = 0, [node], {node.id}
    while stack:
        for i in stack.pop().inputs:
            src = s.graph[i]
            if src.op != "concat" or src.attr("axis") != axis:
                largest = max(largest, s.chunk((i, axis)))
            elif (i, axis) in measured:
                largest = max(largest, measured[(i, axis)])
            elif i not in seen:
                seen.add(i)
                stack.append(src)
                largest = max(largest, _merge_limit(src, axis, s))
    measured[(node.id, axis)] = largest
    return largest


def join_pieces(pieces: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """A concat's chunks along its axis: its operands' chunks (`pieces`) in order, each run
    of pieces that together hold at most `limit` joined into one chunk (one task reads
    them all), empty pieces dropped (an empty axis is one empty chunk). A 5,000-way concat
    of rows is then a few tasks, not 5,000, each a scheduler round trip."""
    out: list[int] = []
    run = 0
    for piece in pieces:
        if run and run + piece > limit:
            out.append(run)
            run = 0
        run += piece
    if run or not out:
        out.append(run)
    return tuple(out)


def _joined_count(extent: int, limit: int, pieces: list[int]) -> int:
    """At most how many chunks `join_pieces` makes of `pieces` (each operand's chunk count)
    along an axis of `extent`: no more than the pieces, and, since two neighbouring chunks
    together always hold more than `limit`, no more than 2 * (extent // (limit + 1)) + 1."""
    return min(sum(pieces), 2 * (extent // (limit + 1)) + 1)
