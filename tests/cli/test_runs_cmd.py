"""`deepx-flow run --db`, `runs`, `runs show` and `placement`, as separate processes reading
the metadata database a real run wrote."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from deepx_flow.meta import open_db, queries

GRAPH = """\
deepx: 1
inputs:
  x: {shape: [400, 30], dtype: float64}
nodes:
  - {id: y, op: tanh, args: [x]}
  - {id: s, op: sum, args: [y], attrs: {axes: [1]}}
outputs: [s]
"""


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def recorded(tmp_path, scheduler, db_url):
    """A run made by `deepx-flow run --db`: its database URL and run row."""
    (tmp_path / "g.yaml").write_text(GRAPH)
    x = np.random.default_rng(1).standard_normal((400, 30))
    np.save(tmp_path / "x.npy", x)
    res = cli("run", str(tmp_path / "g.yaml"), "-i", f"x={tmp_path / 'x.npy'}",
              "-o", f"s={tmp_path / 's.npy'}", "--scheduler", scheduler, "--db", db_url)
    assert res.returncode == 0, res.stderr
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), np.tanh(x).sum(axis=1))
    (run,) = queries.list_runs(open_db(db_url))
    return db_url, run


def test_runs_lists_and_shows_a_run(recorded):
    url, run = recorded
    listing = cli("runs", "--db", url)
    assert listing.returncode == 0, listing.stderr
    assert run.id[:12] in listing.stdout and "succeeded" in listing.stdout

    show = cli("runs", "show", run.id[:8], "--tasks", "--db", url)
    assert show.returncode == 0, show.stderr
    tasks = queries.run_tasks(open_db(url), run.id)
    assert f"run {run.id}" in show.stdout and "tasks by operator" in show.stdout
    assert all(t.key in show.stdout for t in tasks)
    assert "compute/communication" in show.stdout  # the stored plan


def test_placement_of_a_persisted_run(tmp_path, scheduler, db_url, monkeypatch):
    import deepx_flow as dx
    from distributed import Client

    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    with Client(scheduler) as client:
        p = dx.persist(dx.random.normal((500, 300), seed=2) * 3.0, client=client).wait()
        held = {(",".join(map(str, k[1:])), w) for k, ws in client.who_has(p.futures).items()
                for w in ws}
        run = queries.list_runs(open_db(db_url))[0]
        res = cli("placement", run.id, "--db", db_url)
        assert res.returncode == 0, res.stderr
        lines = [line.split() for line in res.stdout.splitlines() if line.startswith(p.key)]
        assert {(cols[1], cols[2]) for cols in lines} == held
        p.release()


def test_unknown_run_is_one_clear_error(db_url):
    res = cli("runs", "show", "nosuchrun", "--db", db_url)
    assert res.returncode == 2
    assert "no run 'nosuchrun'" in res.stderr and "Traceback" not in res.stderr


def test_newer_database_is_refused(tmp_path):
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'new.db'}"
    open_db(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE deepx_schema SET version = version + 1"))
    engine.dispose()
    res = cli("runs", "--db", url)
    assert res.returncode == 2
    assert "newer than this deepx_flow knows" in res.stderr
