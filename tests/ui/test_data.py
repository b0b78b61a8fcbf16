"""The dashboard's listings: a page of runs sorted in the database is the same page as
sorting every run in Python, and the pages together hold every row once."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepx_flow.meta.models import GraphRecord, Run
from deepx_flow.ui.data import RUNS

STATUSES = ("running", "succeeded", "failed", "interrupted")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import close_all
    db = open_db(f"sqlite:///{tmp_path_factory.mktemp('ui') / 'deepx.db'}")
    rng = random.Random(6)
    runs = []
    for i in range(137):
        start = 1.7e9 + rng.choice([0, 1, 2]) * 100.0 + i  # equal sort values across rows
        ended = None if rng.random() < 0.2 else start + rng.random() * 50
        runs.append(Run(id=f"{i:04d}{rng.getrandbits(32):08x}", graph_hash="g",
                        started_at=start, ended_at=ended, status=rng.choice(STATUSES),
                        kind=rng.choice(["run", "persist", "materialize"]), scheduler="s",
                        cluster="c", n_workers=rng.randint(1, 8), n_tasks=rng.randint(1, 9),
                        n_chunks=1, host="h", pid=1, username=rng.choice(["ann", "bo"])))
    with db.session() as s:
        s.add(GraphRecord(hash="g", n_nodes=1, created_at=0.0))
        s.add_all(runs)
    yield db, runs
    close_all()


def python_value(run: Run, column: str):
    return {"id": run.id, "status": run.status, "kind": run.kind, "started": run.started_at,
            "seconds": (run.ended_at if run.ended_at is not None else run.started_at)
            - run.started_at, "tasks": run.n_tasks, "workers": run.n_workers,
            "cluster": run.cluster, "host": run.host, "user": run.username,
            "error": run.error}[column]


@settings(max_examples=40, deadline=None)
@given(column=st.sampled_from(["id", "status", "kind", "started", "seconds", "tasks",
                               "workers", "user"]),
       descending=st.booleans(), size=st.integers(1, 60),
       status=st.sampled_from([None, *STATUSES]))
def test_pages_sorted_in_the_database_match_python(seeded, column, descending, size, status):
    db, runs = seeded
    want = [r for r in runs if status is None or r.status == status]
    # Python's order: by the column, then by id ascending (the listing's tie-break).
    want.sort(key=lambda r: r.id)
    want.sort(key=lambda r: python_value(r, column), reverse=descending)
    got, offset = [], 0
    while True:
        page = RUNS.page(db, column, descending, offset, size, status=status)
        assert page.total == len(want) and page.offset == offset
        got += [row["id"] for row in page.rows]
        if len(page.rows) < size:
            break
        offset += size
    assert got == [r.id for r in want]
    values = [python_value(r, column) for r in want]
    for row, value in zip((row for o in range(0, len(want), size)
                           for row in RUNS.page(db, column, descending, o, size,
                                                status=status).rows), values):
        assert row[column] == (pytest.approx(value) if isinstance(value, float) else value)


def test_an_unknown_sort_column_falls_back_to_the_default(seeded):
    db, runs = seeded
    page = RUNS.page(db, "started; DROP TABLE runs", None, 0, 5)
    newest = sorted(runs, key=lambda r: (-r.started_at, r.id))[:5]
    assert [row["id"] for row in page.rows] == [r.id for r in newest]
    assert page.columns[0] == "id" and "error" in page.columns
