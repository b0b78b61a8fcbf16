"""`deepx-flow assets list|status|history` and `deepx-flow materialize` on a pipeline file
written into the test's folder: what they print is checked against the metadata database and
the stored values against NumPy; bad input exits 2 with one line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.assets import catalog
from deepx_flow.cli.main import main
from deepx_flow.meta import open_db, queries
from deepx_flow.meta.db import close_all
from tests.helpers import without_run_headers

PIPELINE = """\
import deepx_flow as dx


@dx.asset(code_version="{version}")
def base():
    return dx.arange(12, dtype="float64").reshape((3, 4)) * {version}.0


@dx.asset(code_version="1")
def scaled(base):
    return base * 3.0 + 1.0


@dx.asset
def total(scaled):
    return scaled.sum(axis=0)


defs = dx.Definitions(assets=[base, scaled, total])
"""


def expected(version: int) -> dict[str, np.ndarray]:
    base = np.arange(12, dtype=np.float64).reshape(3, 4) * version
    return {"base": base, "scaled": base * 3 + 1, "total": (base * 3 + 1).sum(axis=0)}


@pytest.fixture
def project(tmp_path, db_url, monkeypatch):
    """The pipeline file (base at code version 1), a fresh database and asset root."""
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    path = tmp_path / "pipeline.py"
    path.write_text(PIPELINE.format(version=1))
    yield path
    close_all()


def lines_of(text: str) -> dict[str, str]:
    """Table rows by their first cell."""
    return {line.split()[0]: line for line in text.splitlines() if line.strip()}


def test_materialize_list_status_history(project, db_url, scheduler, capsys):
    assert main(["materialize", "-m", str(project), "--scheduler", scheduler]) == 0
    out = capsys.readouterr().out
    db = open_db(db_url)
    rows = {name: catalog.latest(db, name) for name in ("base", "scaled", "total")}
    (run,) = queries.list_runs(db)
    assert f"run {run.id}" in out and all(r.run_id == run.id for r in rows.values())
    for name, row in rows.items():
        assert f"{name}: version {row.version[:12]}" in out
        np.testing.assert_array_equal(dx.run(dx.load(name), scheduler=scheduler),
                                      expected(1)[name])

    assert main(["assets", "list", "-m", str(project)]) == 0
    listed = lines_of(capsys.readouterr().out)
    assert listed["scaled"].split()[1:5] == ["base", "1", "zarr", "-"]
    for name, row in rows.items():
        assert row.version[:12] in listed[name]
    assert "3x4" in listed["base"] and "float64" in listed["total"]

    assert main(["assets", "status", "-m", str(project)]) == 0
    status = lines_of(capsys.readouterr().out)
    assert all(status[name].split()[1] == "fresh" for name in rows)

    project.write_text(PIPELINE.format(version=2))  # the user changed base's code
    assert main(["assets", "status", "-m", str(project)]) == 0
    status = lines_of(capsys.readouterr().out)
    assert status["base"].split()[1] == "stale" and "code version '1' -> '2'" in status["base"]
    assert status["scaled"].split()[1] == "fresh"  # nothing newer upstream yet

    assert main(["materialize", "-m", str(project), "--only-stale",
                 "--scheduler", scheduler]) == 0
    out = capsys.readouterr().out
    new = {name: catalog.latest(db, name) for name in rows}
    assert all(new[name].version != rows[name].version for name in rows)
    for name in rows:  # downstream of a stale asset is materialized too
        assert f"{name}: version {new[name].version[:12]}" in out
        np.testing.assert_array_equal(dx.run(dx.load(name), scheduler=scheduler),
                                      expected(2)[name])
    assert main(["materialize", "-m", str(project), "--only-stale"]) == 0  # no cluster needed
    assert capsys.readouterr().out.startswith("nothing to materialize")

    assert main(["assets", "history", "base"]) == 0
    history = capsys.readouterr().out
    assert history.startswith("base: 2 stored versions")
    assert history.index(new["base"].version[:12]) < history.index(rows["base"].version[:12])
    assert new["base"].uri in history and run.id[:12] in history
    assert main(["assets", "history", "base", "--limit", "1", "--db", db_url]) == 0
    history = capsys.readouterr().out
    assert new["base"].version[:12] in history and rows["base"].version[:12] not in history


def test_selection_words_are_one_selection(project, db_url, scheduler, capsys):
    assert main(["materialize", "-m", f"{project}:defs", "base", "scaled",
                 "--scheduler", scheduler]) == 0
    db = open_db(db_url)
    assert catalog.latest(db, "total") is None
    assert {catalog.latest(db, n).run_id for n in ("base", "scaled")} == \
        {queries.list_runs(db)[0].id}  # one run for both
    assert main(["assets", "status", "-m", str(project)]) == 0
    status = lines_of(capsys.readouterr().out)
    assert status["total"].split()[1] == "stale" and "never materialized" in status["total"]


def test_materialize_as_a_command(project, tmp_path, scheduler):
    """The console path: its own process, its own embedded cluster, `--db` for both the
    asset rows and the run's record."""
    url = f"sqlite:///{(tmp_path / 'other.db').as_posix()}"
    res = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "materialize", "-m",
                          "pipeline", "*total", "--db", url], cwd=tmp_path, check=False,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    db = open_db(url)
    (run,) = queries.list_runs(db)
    assert run.status == "succeeded" and f"run {run.id}" in res.stdout
    for name in ("base", "scaled", "total"):
        row = catalog.latest(db, name)
        assert row.run_id == run.id and f"{name}: version {row.version[:12]}" in res.stdout
        assert row.uri.startswith(str(tmp_path / "assets" / name))
    np.testing.assert_array_equal(dx.run(dx.load("total", db=url), scheduler=scheduler),
                                  expected(1)["total"])


def test_bad_input_is_one_line_exit_2(project, tmp_path, capsys):
    def error(argv) -> str:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1, err
        return err

    assert "'no_such_pipeline'" in error(["assets", "list", "-m", "no_such_pipeline"])
    assert "no asset named 'totl' (did you mean 'total'?)" in \
        error(["materialize", "-m", str(project), "base", "totl"])
    two = tmp_path / "two.py"
    two.write_text(PIPELINE.format(version=1) + "\nother = dx.Definitions(assets=[base])\n")
    err = error(["assets", "status", "-m", str(two)])
    assert "2 dx.Definitions objects (defs, other)" in err and "MODULE:ATTRIBUTE" in err
    assert "asset 'base' has no stored versions" in error(["assets", "history", "base"])
    assert "no 'nope'" in error(["materialize", "-m", f"{project}:nope"])
    with pytest.raises(SystemExit) as exit_:  # argparse's own errors: one line too
        main(["materialize", "base"])
    assert exit_.value.code == 2 and "-m/--module" in capsys.readouterr().err


def test_failed_check_says_what_was_stored_and_exits_1(project, db_url, scheduler, capsys):
    checked = PIPELINE.replace('@dx.asset(code_version="{version}")',
                               '@dx.asset(code_version="{version}", '
                               'checks=[dx.checks.in_range(high=20)])')
    project.write_text(checked.format(version=2))  # base's values reach 22
    assert main(["materialize", "-m", str(project), "--scheduler", scheduler]) == 1
    out, err = capsys.readouterr()
    (row,) = catalog.history(open_db(db_url), "base")
    assert f"base: version {row.version[:12]}" in out
    assert "checks: in_range FAILED (" in out.splitlines()[0]
    assert "scaled: not materialized" in out and "total: not materialized" in out
    errors = without_run_headers(err)
    assert len(errors) == 1 and "blocking check in_range failed" in errors[0]

    assert main(["assets", "list", "-m", str(project)]) == 0
    assert lines_of(capsys.readouterr().out)["base"].split()[4] == "in_range"
    assert main(["assets", "history", "base"]) == 0
    assert lines_of(capsys.readouterr().out)[row.version[:12]].split()[-2] == "failed"


PARTITIONED = """\
import deepx_flow as dx


@dx.asset(partitions=dx.StaticPartitions(["east", "west"]), partition_axis=0)
def sales(partition):
    return dx.full((2, 3), float(partition.index + 1))


defs = dx.Definitions(assets=[sales])
"""


def test_partitions(project, db_url, scheduler, capsys):
    project.write_text(PARTITIONED)
    assert main(["materialize", "-m", str(project), "--partitions", "west",
                 "--scheduler", scheduler]) == 0
    (row,) = catalog.history(open_db(db_url), "sales")
    assert row.partition == "west" and "sales[west]: version" in capsys.readouterr().out
    np.testing.assert_array_equal(
        dx.run(dx.load("sales", partition="west"), scheduler=scheduler), np.full((2, 3), 2.0))
    assert main(["assets", "list", "-m", str(project)]) == 0
    assert "1 partitions  2x3" in lines_of(capsys.readouterr().out)["sales"]
    assert main(["assets", "history", "sales"]) == 0
    assert lines_of(capsys.readouterr().out)[row.version[:12]].split()[1] == "west"
    assert main(["materialize", "-m", str(project), "--partitions", "east,west",
                 "--only-stale", "--scheduler", scheduler]) == 0
    assert "sales[east]: version" in capsys.readouterr().out
    assert len(catalog.history(open_db(db_url), "sales")) == 2  # west was fresh


DAILY = """\
import deepx_flow as dx


@dx.asset(partitions=dx.DailyPartitions("2025-01-01", end="2025-02-10"),
          checks=[dx.checks.all_finite, dx.checks.in_range(high=30, blocking=False)])
def readings(partition):
    return dx.full((4, 2), float(partition.index))


defs = dx.Definitions(assets=[readings])
"""


def test_a_backfill_is_summed_up_with_its_checks(project, db_url, scheduler, capsys):
    """40 daily partitions are one line, with each check counted over them and the
    partitions where one failed named; a few partitions are a line each, with their
    checks."""
    project.write_text(DAILY)
    with pytest.warns(UserWarning, match="check in_range failed"):
        assert main(["materialize", "-m", str(project), "--scheduler", scheduler]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = catalog.history(open_db(db_url), "readings")
    assert len(rows) == 40
    failing = sorted(r.partition for r in rows if r.partition > "2025-01-31")  # index > 30
    assert len(failing) == 9
    assert out[0] == (f"readings: 40 partitions 2025-01-01 ... 2025-02-09, each (4, 2) "
                      f"float64, 2.5 KiB in all; checks: all_finite passed on all 40, "
                      f"in_range FAILED on 9 of 40 ({', '.join(failing[:3])} and 6 more)")
    assert len(out) == 2 and out[1].startswith("run ")
    assert main(["materialize", "-m", str(project), "--partitions",
                 "2025-01-02...2025-01-03", "--scheduler", scheduler]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out[:2]] == ["readings[2025-01-02]",
                                                         "readings[2025-01-03]"]
    assert all(line.endswith("; checks: all_finite passed, in_range passed")
               for line in out[:2])
