"""The registry page's chunk grid: one cell part per placement row, at its chunk index's
row and column, coloured by its worker; replicas share their chunk's cell side by side; a
1-D tensor is one row, and dimensions past the second flatten into the columns."""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.meta.models import ChunkPlacement
from deepx_flow.ui.chunk_grid import (ALPHAS, LOST_OUTLINE_WIDTH, axis_labels, cells,
                                      chunk_index, drawable, figure, grid_position,
                                      worker_colors)

WORKERS = [f"tcp://10.0.0.{i}:4000" for i in range(4)]
STATES = list(ALPHAS)


def placement(chunk, worker, state="memory", nbytes=800):
    return ChunkPlacement(run_id="r", tensor="x@t", chunk=chunk, worker=worker, tier="host",
                          nbytes=nbytes, state=state, updated_at=0.0)


@st.composite
def placement_rows(draw):
    ndim = draw(st.integers(0, 4))
    extents = draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    grid = list(itertools.product(*[range(n) for n in extents]))
    chunks = draw(st.lists(st.sampled_from(grid), unique=True, max_size=20))
    rows = []
    for index in chunks:
        for worker in draw(st.lists(st.sampled_from(WORKERS), min_size=1, max_size=3,
                                    unique=True)):
            rows.append(placement(",".join(map(str, index)), worker,
                                  draw(st.sampled_from(STATES)),
                                  draw(st.one_of(st.none(), st.integers(0, 2**40)))))
    return rows


@settings(max_examples=200, deadline=None)
@given(placement_rows())
def test_each_placement_is_one_cell_part_of_its_chunks_cell(rows):
    cols = cells(rows)
    assert all(len(v) == len(rows) for v in cols.values())
    assert sorted(zip(cols["chunk"], cols["worker"], cols["state"])) == \
        sorted((r.chunk, r.worker, r.state) for r in rows)
    colors = worker_colors(r.worker for r in rows)
    assert cols["color"] == [colors[w] for w in cols["worker"]]
    assert len(set(colors.values())) == len(colors)  # a colour per worker
    parts = defaultdict(list)
    for chunk, row, col, x, width, y in zip(cols["chunk"], cols["row"], cols["col"], cols["x"],
                                            cols["width"], cols["y"]):
        parts[chunk].append((row, col, x, width, y))
    cells_of = {}
    for chunk, found in parts.items():
        assert len({(row, col) for row, col, *_ in found}) == 1  # one cell per chunk
        row, col = found[0][:2]
        assert all(y == row for *_, y in found)
        # the parts tile the cell [col - 0.5, col + 0.5] side by side
        spans = sorted((x - w / 2, x + w / 2) for _, _, x, w, _ in found)
        assert math.isclose(spans[0][0], col - 0.5) and math.isclose(spans[-1][1], col + 0.5)
        assert all(math.isclose(a[1], b[0]) for a, b in zip(spans, spans[1:]))
        cells_of[chunk] = (row, col)
    assert len(set(cells_of.values())) == len(cells_of)  # different chunks, different cells
    ndim = max((len(chunk_index(c)) for c in cells_of), default=0)
    if ndim <= 1:
        assert all(row == 0 for row, _ in cells_of.values())
    else:
        assert all(row == chunk_index(c)[0] for c, (row, _) in cells_of.items())


def test_a_2d_tensor_is_its_chunk_grid():
    rows = [placement(f"{i},{j}", WORKERS[(i + j) % 2]) for i in range(3) for j in range(2)]
    cols = cells(rows)
    assert list(zip(cols["chunk"], cols["row"], cols["col"])) == \
        [(f"{i},{j}", i, j) for i in range(3) for j in range(2)]
    assert cols["width"] == [1.0] * 6 and cols["x"] == [float(j) for _ in range(3)
                                                         for j in range(2)]
    assert axis_labels(cols) == ("chunk index along axis 1", "chunk index along axis 0")


def test_a_1d_tensor_is_one_row_and_a_3d_one_flattens():
    cols = cells([placement(str(i), WORKERS[0]) for i in range(5)])
    assert cols["row"] == [0] * 5 and cols["col"] == list(range(5))
    assert axis_labels(cols)[0] == "chunk index"
    assert grid_position((1, 2, 3), (2, 3, 4)) == (1, 2 * 4 + 3)
    cols = cells([placement(f"{i},{j},{k}", WORKERS[0])
                  for i in range(2) for j in range(2) for k in range(3)])
    assert sorted(set(cols["col"])) == list(range(6))
    assert axis_labels(cols)[0].endswith("(axes 1-2 flattened)")


def test_replicas_split_the_cell_and_states_show():
    cols = cells([placement("0,0", WORKERS[1], "spilled"), placement("0,0", WORKERS[0], "lost")])
    assert cols["worker"] == WORKERS[:2] and cols["width"] == [0.5, 0.5]
    assert cols["x"] == [-0.25, 0.25]
    assert cols["alpha"] == [ALPHAS["lost"], ALPHAS["spilled"]]
    assert cols["outline"] == [LOST_OUTLINE_WIDTH, 0.0]  # only the lost part is outlined


def test_the_figure_names_its_source():
    fig = figure(cells([placement("0,1", WORKERS[0], nbytes=None)]))
    source = fig.select_one({"name": "chunk-grid"})
    assert source.data["chunk"] == ["0,1"] and source.data["size"] == ["-"]



def _negative_or_not_numbers(chunk: str) -> bool:
    try:
        return min(chunk_index(chunk), default=0) < 0
    except ValueError:
        return True


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(
    st.lists(st.integers(0, 50), max_size=3).map(lambda ix: ",".join(map(str, ix))),
    st.text(max_size=6)), max_size=12))
def test_only_chunk_indices_of_whole_numbers_from_zero_are_drawn(chunks):
    rows = [placement(c, WORKERS[0]) for c in chunks]
    good, bad = drawable(rows)
    assert sorted(map(id, good + bad)) == sorted(map(id, rows))  # each row on one side
    assert not any(_negative_or_not_numbers(r.chunk) for r in good)
    assert all(_negative_or_not_numbers(r.chunk) for r in bad)
    written = {c for c in chunks if re.fullmatch(r"(\d+(,\d+)*)?", c)}
    assert written <= {r.chunk for r in good}
    cells(good)  # draws without error
