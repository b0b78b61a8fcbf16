"""What a run's outputs are, read from its records: for a materialization, the asset
version each output stored and the check each measured.

`dx.materialize` runs a stage of targets as one graph whose outputs are named by position
(`deepx_flow/assets/materialize.py`): `t<i>` is the stage's i-th target, `t<i>_check<j>_<k>`
the k-th tensor the target's j-th check measures. The stage's versions are published in
that order in one transaction (`assets.catalog.record_all`), each row followed by its check
results in the order of the asset's checks. So the run's i-th materialization (by id) is
what `t<i>` stored, and its j-th check result is check j. `output_rows` pairs them up; a
name the rows do not account for (a failed stage stores nothing) keeps only its tensor.
`user_names` says which names are the user's (the graph page labels nodes by them).
"""

from __future__ import annotations

import json
import re

from sqlmodel import col, select

from deepx_flow.meta.models import AssetCheckResult, AssetMaterialization

COLUMNS = ("output", "asset", "partition", "check", "result", "version", "bytes", "tensor")
_TARGET = re.compile(r"t(\d+)")
_CHECK = re.compile(r"t(\d+)_check(\d+)_(\d+)")
# The names `dx.run` and friends give outputs the user did not name (`sdk/build.py`).
_GENERATED = re.compile(r"out\d+(_\d+)?")


def recorded_outputs(run) -> dict[str, str]:
    """Output name -> tensor key, as the run recorded them ({} when it did not)."""
    try:
        outputs = json.loads(run.outputs or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in outputs.items()} if isinstance(outputs, dict) else {}


def stored_by(db, run_id: str) -> list[tuple[AssetMaterialization, list[AssetCheckResult]]]:
    """The versions `run_id` stored, in the order they were recorded, each with its check
    results in theirs."""
    with db.read() as session:
        versions = list(session.exec(select(AssetMaterialization)
                                     .where(AssetMaterialization.run_id == run_id)
                                     .order_by(col(AssetMaterialization.id))))
        ids = [v.id for v in versions]
        checks = list(session.exec(select(AssetCheckResult)
                                   .where(col(AssetCheckResult.materialization_id).in_(ids))
                                   .order_by(col(AssetCheckResult.id)))) if ids else []
    by_version: dict = {}
    for c in checks:
        by_version.setdefault(c.materialization_id, []).append(c)
    return [(v, by_version.get(v.id, [])) for v in versions]


def output_rows(outputs: dict[str, str], stored: list) -> list[dict]:
    """A row per output (`COLUMNS`), in the run's order: for a materialization's outputs,
    the asset, partition and version it stored (or checked: the check's name and result).
    `stored` is `stored_by`'s list; a materialization's outputs are matched to it only when
    its targets and versions agree in number, so a name is never given to the wrong row."""
    targets = {int(m.group(1)) for name in outputs if (m := _TARGET.fullmatch(name))}
    matched = bool(stored) and targets == set(range(len(stored)))
    rows = []
    for name, tensor in outputs.items():
        row = dict.fromkeys(COLUMNS, "")
        row.update(output=name, tensor=tensor, bytes=None)
        target, check = _TARGET.fullmatch(name), _CHECK.fullmatch(name)
        if matched and (target or check):
            version, results = stored[int((target or check).group(1))]
            row.update(asset=version.asset, partition=version.partition or "",
                       version=version.version)
            if target:
                row["bytes"] = version.nbytes
            else:
                j = int(check.group(2))
                result = results[j] if j < len(results) else None
                row.update(check=result.check if result else f"check {j}",
                           result="" if result is None else
                           "passed" if result.passed else "failed")
        rows.append(row)
    return rows


def user_names(rows: list[dict]) -> dict[str, str | None]:
    """Output name -> the name the user knows that output by (`output_rows`' rows): a
    materialization's the asset it stored ("daily[2026-01-02]") or the check it measured
    ("features: all_finite"), a name the user gave it as is; None for a name made for it
    by position (`out0`, and `t<i>` that no stored version accounts for)."""
    names: dict[str, str | None] = {}
    for row in rows:
        name = row["output"]
        if row["asset"]:
            shown = row["asset"] + (f"[{row['partition']}]" if row["partition"] else "")
            names[name] = f"{shown}: {row['check']}" if row["check"] else shown
        elif _GENERATED.fullmatch(name) or _TARGET.fullmatch(name) or _CHECK.fullmatch(name):
            names[name] = None
        else:
            names[name] = name
    return names
