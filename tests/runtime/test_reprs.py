"""What a notebook shows for the objects a run gives back: a plan (its explain tables and
chunk grids, not a dataclass dump), a persisted tensor (where its chunks are, or that they
are still being computed), a placement, and a training result. HTML is checked to parse,
with every value escaped."""

from __future__ import annotations

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.kernels.faults import Fault
from tests.helpers import Cells, cluster_with_memory, faults_on


def graph():
    x = dx.input("x", shape=(4000, 64), dtype="float32")
    return x, (dx.exp(x) * 2.0).sum(axis=1)


def test_a_plan_shows_its_tables_and_grids():
    x, y = graph()
    spec = cluster_with_memory(2**20)
    plan = dx.compile(y, cluster=spec)
    text = repr(plan)
    stats = plan.stats()
    assert text.startswith(f"<Plan for cluster '{spec.name}'") and len(text) < 200
    assert f"{stats.tasks:,} tasks" in text
    cells = Cells(plan._repr_html_()).cells
    grid = plan.partition.chunks["x"]
    row = cells.index("x")
    assert cells[row:row + 7] == ["x", "input", "(4000, 64)", "float32",
                                  str((max(grid[0]), 64)), str(len(grid[0])),
                                  f"{len(grid[0])} x 1"]
    assert len(grid[0]) > 1  # a real grid, cut by the 1 MiB budget
    # Every line of explain() is in the HTML: the same facts, as tables.
    for line in plan.explain().splitlines()[3:]:
        if line and not line.startswith("--"):
            assert line.split()[0] in cells or line.startswith(("Totals", "Estimated"))


def test_a_persisted_tensor_says_where_its_chunks_are(client):
    x, y = graph()
    data = np.random.default_rng(0).standard_normal((4000, 64), dtype="float32")
    kept = dx.persist(dx.exp(x) * 2.0, inputs={"x": data}, client=client,
                      cluster=cluster_with_memory(2**20)).wait()
    n = len(kept.futures)
    assert repr(kept) == (f"<Persisted '{kept.name}' (4000, 64) float32: {n} of {n} chunks "
                          f"computed; dx.placement(p) says where>")
    where = kept.where()
    live = set(client.scheduler_info()["workers"])
    assert set(where) <= live and sum(c for c, _ in where.values()) == n
    assert sum(b for _, b in where.values()) == data.nbytes
    cells = Cells(kept._repr_html_()).cells
    for worker, (chunks, _) in where.items():
        assert cells[cells.index(worker) + 1] == str(chunks)
    shown = str(dx.placement(kept))
    assert "still being computed" not in shown and len(dx.placement(kept)) == n
    kept.release()
    assert repr(kept).endswith(": released>") and "released" in kept._repr_html_()


def test_placement_right_after_persist_says_the_chunks_are_being_computed(client):
    x, y = graph()
    data = np.ones((4000, 64), dtype="float32")
    # The hang is aimed at the tasks of the persisted tensor, `mul` (exp is fused into
    # them, so a fault aimed at exp fired in no task, and the test only passed while the
    # chunks were slower to compute than the lines below were to run).
    with faults_on(client, Fault("hang", node="mul")):
        kept = dx.persist(dx.exp(x) * 3.0, inputs={"x": data}, client=client,
                          cluster=cluster_with_memory(2**20))
        where = dx.placement(kept)
        n = len(kept.futures)
        assert where.pending == n and where.chunks == n
        assert str(where).splitlines()[-1] == (
            f"{n} of {n} chunks are still being computed: p.wait() waits for them, or ask "
            "again later")
        assert "still being computed" in where._repr_html_()
        assert kept.where()["pending"] == (n, 0)
    kept.wait()
    assert dx.placement(kept).pending == 0
    np.testing.assert_array_equal(kept.to_numpy(), np.exp(data) * np.float32(3.0))
    kept.release()


def test_a_tensor_never_run_has_no_placement_and_says_why():
    x = dx.input("never_run", shape=(3,), dtype="float64")
    shown = str(dx.placement(x + 1.0))
    assert "no chunk of it is recorded" in shown


def test_a_training_result_is_one_line_not_its_arrays(client):
    rng = np.random.default_rng(0)
    features = rng.standard_normal((256, 8)).astype("float32")
    labels = (features @ rng.standard_normal((8, 1)).astype("float32"))
    model = dx.nn.Sequential(dx.nn.Linear(8, 1))

    def loss(params, x, y):
        return ((model(params, x) - y) ** 2.0).mean()

    params = model.init(seed=0)
    start = dict(zip(params, dx.run(list(params.values()), client=client)))
    fit = dx.train(loss, start, data=(features, labels), batch_size=64, epochs=2,
                   client=client, progress=False)
    text = repr(fit)
    first, last = fit.history[0]["loss"], fit.history[-1]["loss"]
    assert text.startswith(f"<Fit: steps {fit.steps}; loss {first:.4g} -> {last:.4g}")
    assert "array(" not in text and len(text) < 300
    cells = Cells(fit._repr_html_()).cells
    assert cells[cells.index("parameters") + 1] == (
        f"{len(fit.values)} tensors, {sum(v.size for v in fit.values.values()):,} values")


def test_runs_lists_the_recorded_runs_newest_first(client, tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPX_DB_URL", f"sqlite:///{tmp_path / 'runs.db'}")
    assert str(dx.runs()).startswith("no runs in ") and len(dx.runs()) == 0
    x = dx.input("x", shape=(10,), dtype="float64")
    dx.run(x * 2.0, inputs={"x": np.arange(10.0)}, client=client)
    with faults_on(client, Fault("raise", node="exp")), pytest.raises(dx.DeepxError):
        dx.run(dx.exp(x), inputs={"x": np.arange(10.0)}, client=client,
               recovery=dx.Recovery(retries=0))
    dx.run(x + 1.0, inputs={"x": np.arange(10.0)}, client=client)
    listed = dx.runs()
    assert len(listed) == 3 and len(dx.runs(limit=1)) == 1
    assert [r.run.id for r in listed[1:]] == [listed[1].run.id, listed[2].run.id]
    assert str(listed[:1]).splitlines()[2].startswith(listed[0].run.id[:12])
    assert [listed[i].run.status for i in range(3)] == ["succeeded", "failed", "succeeded"]
    assert [r.run.id for r in dx.runs(status="failed")] == [listed[1].run.id]
    assert listed[0].run.started_at >= listed[1].run.started_at >= listed[2].run.started_at
    lines = str(listed).splitlines()
    assert lines[0].split()[:3] == ["run", "kind", "status"]
    assert lines[2].startswith(listed[0].run.id[:12])
    newest = listed[0].run
    assert repr(listed[0]) == (f"<run {newest.id} run succeeded: {newest.n_tasks:,} tasks, "
                               f"{newest.ended_at - newest.started_at:.2f} s>")
    assert repr(listed[1]).startswith(f"<run {listed[1].run.id} run failed: ")
    assert "; " in repr(listed[1])  # its error's first line follows
    cells = Cells(listed._repr_html_()).cells
    assert cells[:3] == ["run", "kind", "status"] and listed[2].run.id[:12] in cells
    facts = Cells(listed[1]._repr_html_()).cells
    assert facts[facts.index("dashboard") + 1].endswith(f"/run?id={listed[1].run.id}")
    assert facts[facts.index("error") + 1]
    with pytest.raises(dx.DeepxError, match="status must be one of"):
        dx.runs(status="done")
