"""A run page's "tasks planned" is its plan's total, in a real browser over the seeded
database (tests/ui/conftest.py) and runs made here on its cluster: for a fused graph, a
batch-chained conv net and a loss whose sums are finished inside its mean, the plan's total,
the tasks the run submitted and the tasks it recorded are one number; a materialization
submitted the plan's tasks and its writes to storage, and the page says how many; a
training's graph of several steps says that its plan is one step's.

Adds runs to the shared database; no other module counts them after it (it sorts last).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.compiler.batch_chain import batch_chains
from deepx_flow.meta.models import Run
from deepx_flow.meta.queries import list_runs, run_tasks
from deepx_flow.runtime.run import cluster_spec
from tests.compiler.test_batch_chain import cnn
from tests.ui.browser import page_text, visit
from tests.ui.test_browser_graph import first_dx_run

pytestmark = pytest.mark.slow


def shown_facts(page) -> dict:
    page.wait_for_selector(".deepx-run-facts .deepx-grid-row")
    what = page.locator(".deepx-run-facts td[data-field='what']").all_inner_texts()
    value = page.locator(".deepx-run-facts td[data-field='value']").all_inner_texts()
    return dict(zip(what, value))


def plan_total(page) -> int:
    """The "Totals:" line of the plan the page shows (the run's recorded `explain`)."""
    return int(re.search(r"Totals: ([0-9,]+) tasks", page_text(page)).group(1)
               .replace(",", ""))


def latest_run(db) -> Run:
    return list_runs(db, limit=1)[0]


def small_cluster(client, memory: int):
    spec = cluster_spec(client=client)
    return dataclasses.replace(spec, workers=tuple(
        dataclasses.replace(w, memory=w.reserved + memory) for w in spec.workers))


def agreeing_runs(seeded) -> dict[str, Run]:
    runs = {"fused": first_dx_run(seeded.db)}
    values, out, want = cnn(np.random.default_rng(0), 120)
    cluster = small_cluster(seeded.client, 4 * 2**20)
    plan = dx.compile(out, cluster=cluster)
    assert batch_chains(plan.fused, plan.partition)  # the conv net's layers are one chain
    got = dx.run(out, inputs=values, client=seeded.client, cluster=cluster)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    runs["batch chain"] = latest_run(seeded.db)
    rng = np.random.default_rng(1)
    x, w = dx.input("x", (3000, 5), "float64"), dx.input("w", (5, 2), "float64")
    y = dx.input("y", (3000, 2), "float64")
    logits = x @ w
    loss = (-(y * dx.log_softmax(logits, axis=1)).sum(axis=1)
            / dx.exp(logits).sum(axis=1)).mean()
    dx.run(loss, inputs={"x": rng.standard_normal((3000, 5)),
                         "w": rng.standard_normal((5, 2)),
                         "y": rng.standard_normal((3000, 2))},
           client=seeded.client, cluster=small_cluster(seeded.client, 64 * 2**10))
    runs["sums in a mean"] = latest_run(seeded.db)
    return runs


def test_the_plan_the_run_and_its_page_agree_on_the_tasks(seeded, dashboard, browser):
    for what, run in agreeing_runs(seeded).items():
        assert run.status == "succeeded", what
        recorded = len(run_tasks(seeded.db, run.id))
        page, problems = visit(browser, dashboard, f"run?id={run.id}", "tasks-planned")
        facts = shown_facts(page)
        planned = plan_total(page)
        assert planned == run.n_tasks == recorded > 1, what
        assert facts["tasks planned"] == facts["tasks submitted"] == f"{planned:,}", what
        assert problems == []


def test_a_materialization_says_its_writes_to_storage(seeded, dashboard, browser):
    runs = [r for r in list_runs(seeded.db, limit=1000)
            if r.kind == "materialize" and r.status == "succeeded"]
    assert runs
    for run in runs:
        writes = [t for t in run_tasks(seeded.db, run.id) if t.operator.startswith("store[")]
        page, problems = visit(browser, dashboard, f"run?id={run.id}", "tasks-planned-store")
        facts = shown_facts(page)
        planned = plan_total(page)
        assert facts["tasks planned"] == f"{planned:,}"
        assert run.n_tasks == planned + len(writes) and writes
        assert facts["tasks submitted"] == (
            f"{run.n_tasks:,} (the plan's {planned:,} and {len(writes):,} "
            f"write{'s' * (len(writes) != 1)} to storage)")
        assert problems == []


def test_a_training_graph_says_its_plan_is_one_steps(seeded, dashboard, browser):
    from sqlmodel import select
    with seeded.db.read() as s:
        run = s.exec(select(Run).where(Run.training_id == seeded.fit.training_id)).first()
    page, problems = visit(browser, dashboard, f"run?id={run.id}", "tasks-planned-train")
    facts = shown_facts(page)
    assert facts["tasks planned"] == f"{plan_total(page):,}"
    assert facts["tasks submitted"].startswith(f"{run.n_tasks:,} (one graph of several "
                                               f"training steps")
    assert problems == []
