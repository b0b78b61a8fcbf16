"""How assets show themselves in a notebook and at a prompt: one line each for `repr`, HTML
tables that parse and escape what they show."""

from __future__ import annotations

import numpy as np

import deepx_flow as dx
from tests.helpers import Cells


@dx.asset(code_version="3", checks=[dx.checks.all_finite,
                                    dx.checks.in_range(high=1e9, blocking=False)],
          description="raw <readings> & more")
def raw():
    return dx.arange(12, dtype="float64").reshape((3, 4))


@dx.asset
def doubled(raw):
    return raw * 2.0


DEFS = dx.Definitions(assets=[raw, doubled],
                      schedules=[dx.schedule("0 3 * * *", "doubled", name="nightly")])


def test_an_asset_is_one_line_and_a_table():
    assert repr(raw) == ("<asset 'raw': code version 3; checks all_finite, in_range (warns)>")
    assert repr(doubled) == "<asset 'doubled': upstream raw>"
    cells = Cells(raw._repr_html_()).cells
    assert cells[cells.index("description") + 1] == "raw <readings> & more"  # escaped, read back
    assert "<readings>" not in raw._repr_html_()


def test_definitions_list_assets_upstream_first_and_schedules():
    assert repr(DEFS) == "<Definitions: 2 asset(s) (raw, doubled), 1 schedule(s)>"
    cells = Cells(DEFS._repr_html_()).cells
    assert cells.index("raw") < cells.index("doubled")
    assert cells[cells.index("nightly"):cells.index("nightly") + 4] == [
        "nightly", "0 3 * * *", "UTC", "doubled"]


def test_status_and_materialization_tables(env, client):
    before = Cells(dx.status(DEFS)._repr_html_()).cells
    assert before[before.index("raw") + 1] == "stale"
    done = dx.materialize(DEFS, client=client)
    cells = Cells(done._repr_html_()).cells
    row = done.versions["raw"]
    assert cells[cells.index("raw") + 1] == f"version {row.version[:12]} (3, 4) float64 -> " \
                                            f"{row.uri}"
    assert cells[cells.index("raw") + 2] == "checks: all_finite passed, in_range passed"
    assert str(done).splitlines()[0] == (f"raw: version {row.version[:12]} (3, 4) float64 -> "
                                         f"{row.uri}; checks: all_finite passed, "
                                         f"in_range passed")
    after = Cells(dx.status(DEFS)._repr_html_()).cells
    assert after[after.index("doubled") + 1] == "fresh"
    np.testing.assert_array_equal(dx.run(dx.load("doubled"), client=client),
                                  np.arange(12.0).reshape(3, 4) * 2)
