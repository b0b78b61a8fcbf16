"""The run page's pure parts without a browser: the plan's total read from its recorded
text, what the facts say when the run submitted other tasks than the plan counts, sizes
with their unit, and a materialization's outputs named by the versions and checks its
records hold."""

from __future__ import annotations

import json
from types import SimpleNamespace

import deepx_flow as dx
from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.ui.pages.run import planned_tasks, submitted_text
from deepx_flow.ui.run_outputs import output_rows, recorded_outputs, user_names
from deepx_flow.ui.table import shown, size_text


def test_the_plans_total_is_read_from_its_recorded_text():
    plan = dx.compile((dx.tanh(dx.random.normal((300, 20), seed=1)) * 2.0).sum(axis=0))
    assert planned_tasks(plan.explain()) == plan.stats().tasks
    assert planned_tasks("Totals: 12,345 tasks, 1.0 GFLOP") == 12345
    assert planned_tasks(None) is None and planned_tasks("no plan here") is None


def run(kind="run", n_tasks=4):
    return SimpleNamespace(kind=kind, n_tasks=n_tasks)


def test_the_tasks_submitted_say_why_they_are_not_the_plans():
    assert submitted_text(run(n_tasks=1234), 1234) == "1,234"
    assert submitted_text(run(n_tasks=4), None) == "4"
    assert submitted_text(run("materialize", 3), 2) == \
        "3 (the plan's 2 and 1 write to storage)"
    assert submitted_text(run("materialize", 12), 4) == \
        "12 (the plan's 4 and 8 writes to storage)"
    assert submitted_text(run("train", 16), 34).startswith("16 (one graph of several")
    assert "before inputs are given" in submitted_text(run("run", 1), 2)


def test_sizes_are_written_with_the_projects_unit():
    assert size_text(409_600_000) == format_bytes(409_600_000) == "390.6 MiB"
    assert size_text(512) == "512 B" and size_text(None) == "-"
    assert size_text(float("nan")) == "-" and size_text(True) == "-"
    assert shown(409_600_000, "bytes out") == "390.6 MiB"
    assert shown(409_600_000, "tasks") == 409_600_000  # only byte columns


def version(i, asset, partition=None):
    return AssetMaterialization(id=i, version=f"v{i}", asset=asset, partition=partition,
                                shape="[2]", dtype="float32", nbytes=8 * i, storage="zarr",
                                created_at=float(i))


def check(i, name, passed=True):
    return AssetCheckResult(id=i, materialization_id=0, check=name, passed=passed,
                            created_at=float(i))


def test_a_materializations_outputs_are_named_by_what_they_stored():
    outputs = {"t0": "features@a", "t0_check0_0": "sum@b", "t0_check1_0": "max@c",
               "t1": "mean@d", "t1_check0_0": "shape@e"}
    stored = [(version(1, "features"), [check(1, "all_finite"), check(2, "in_range", False)]),
              (version(2, "daily", "2026-01-01"), [check(3, "shape")])]
    rows = {r["output"]: r for r in output_rows(outputs, stored)}
    assert [rows[n]["asset"] for n in outputs] == ["features"] * 3 + ["daily"] * 2
    assert (rows["t0"]["version"], rows["t0"]["bytes"], rows["t0"]["check"]) == ("v1", 8, "")
    assert (rows["t0_check1_0"]["check"], rows["t0_check1_0"]["result"]) == ("in_range",
                                                                             "failed")
    assert rows["t1_check0_0"]["check"] == "shape"
    assert rows["t1"]["partition"] == "2026-01-01"
    assert all(rows[n]["tensor"] == t for n, t in outputs.items())


def test_the_names_the_user_knows_outputs_by():
    outputs = {"t0": "sum@a", "t0_check0_0": "all@c", "t1": "mean@d"}
    stored = [(version(1, "features"), [check(1, "all_finite")]),
              (version(2, "daily", "2026-01-01"), [])]
    assert user_names(output_rows(outputs, stored)) == {
        "t0": "features", "t0_check0_0": "features: all_finite", "t1": "daily[2026-01-01]"}
    # Names made up by position are no one's; a name the user gave is kept.
    assert user_names(output_rows({"t0": "x@a", "out0": "y@b", "out2_1": "z@c",
                                   "loss": "mean@d", "outer": "e@f"}, [])) == {
        "t0": None, "out0": None, "out2_1": None, "loss": "loss", "outer": "outer"}


def test_outputs_the_records_do_not_account_for_keep_only_their_tensor():
    outputs = {"t0": "x@a", "t1": "y@b"}
    # A failed stage stored nothing; a stage whose rows do not match its outputs in number
    # is not guessed at.
    for stored in ([], [(version(1, "features"), [])]):
        rows = output_rows(outputs, stored)
        assert [(r["output"], r["asset"], r["tensor"]) for r in rows] == \
            [("t0", "", "x@a"), ("t1", "", "y@b")]
    plain = output_rows({"out0": "sum@a"}, [])
    assert plain[0]["output"] == "out0" and plain[0]["asset"] == ""


def test_recorded_outputs_read_the_runs_json_and_nothing_else():
    assert recorded_outputs(SimpleNamespace(outputs=json.dumps({"out0": "k"}))) == \
        {"out0": "k"}
    for text in (None, "", "not json", "[1, 2]"):
        assert recorded_outputs(SimpleNamespace(outputs=text)) == {}
