"""What a notebook shows for the objects a run gives back: a plan (its explain tables and
chunk grids, not a dataclass dump), a persisted tensor (where its chunks are, or that they
are still being computed), a placement, and a training result. HTML is checked to parse,
with every value escaped."""

from __future__ import annotations

import numpy as np

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
    with faults_on(client, Fault("hang", node="exp")):
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
