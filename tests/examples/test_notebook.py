"""The README's notebook example and its asset example, run cell by cell in a real Jupyter
kernel (nbclient drives an ipykernel, as JupyterLab or VS Code would): one embedded cluster
serves every cell, the reprs render as HTML, progress shows (the run's id and dashboard link,
then tqdm's widget, which ends full), results equal NumPy in float64, and no cell shows a
traceback. When the kernel stops, its cluster is gone from the registry and the overview.

The code cells are the README's own blocks, read from README.md, so the README stays true."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.ui.browser import ARTIFACTS

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(heading: str) -> str:
    """The first ```python block under the README's `heading`."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    match = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert match, f"no python block under {heading!r} in README.md"
    return match.group(1)


def cell(source: str) -> str:
    return textwrap.dedent(source).strip()


# What the README does not show, each in a cell after the README's own.
NOTEBOOK_CHECKS = cell("""
    w_np = dx.run(w)  # the random weights, whatever the chunking, from (seed, index)
    rows = slice(0, 3000)
    expected = np.maximum(x_np[rows].astype(np.float64) @ w_np.astype(np.float64) + 1.0,
                           0).sum(axis=1)
    scale = np.abs(x_np[rows].astype(np.float64)) @ np.abs(w_np.astype(np.float64))
    np.testing.assert_allclose(out[rows], expected, rtol=0, atol=1e-5 * scale.sum(axis=1).max())
    assert out.shape == (200_000,) and out.dtype == np.float32
""")

REPRS = ["y", "plan", "kept", "dx.placement(kept)"]

# The README's training block reads x_train, y_train and x_test: scikit-learn's digits, as
# examples/train_digits.py splits them.
TRAINING_DATA = cell("""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x_all, y_all = (digits.data / 16).astype("float32"), digits.target.astype("int64")
    x_train, y_train, x_test, y_test = x_all[:1437], y_all[:1437], x_all[1437:], y_all[1437:]
""")

# The trained model's predictions are its parameters' in float64 (argmax, where the top two
# logits are not within float32 rounding of each other), and it learnt.
TRAINING_CHECKS = cell("""
    v = {k: a.astype(np.float64) for k, a in fit.values.items()}
    logits = np.maximum(x_test @ v["0.weight"] + v["0.bias"], 0) @ v["2.weight"] + v["2.bias"]
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4 * (1 + np.abs(logits).max(axis=1))
    assert (pred[clear] == logits.argmax(axis=1)[clear]).all() and clear.mean() > 0.9
    assert (pred == y_test).mean() > 0.85
    print("checkpoint:", fit.checkpoint)
""")

# A cumsum as a new user writes one (issue 30, item 11: it was quadratic, 117 s), against
# NumPy's float64 running sums, within roundings of the running sums of |terms|.
CUMSUM = cell("""
    c_np = np.random.default_rng(1).standard_normal((100, 8000), dtype="float32")
    c = dx.run(dx.cumsum(dx.input("c", c_np.shape, "float32"), axis=1), inputs={"c": c_np})
    c64 = np.cumsum(c_np.astype(np.float64), axis=1)
    assert c.dtype == np.float32 and c.shape == c_np.shape
    assert (np.abs(c - c64) <= np.finfo(np.float32).eps * np.cumsum(np.abs(c_np), axis=1)).all()
""")

ASSET_CHECKS = cell("""
    import zarr
    features_np = zarr.open_array("data/features.zarr", mode="r")[:]  # the README wrote it
    proj = dx.run(dx.random.normal((512, 64), seed=0))
    f64, p64 = features_np.astype(np.float64), proj.astype(np.float64)
    expected = np.tanh(f64 @ p64)
    # float32 products summed: each off by a few roundings of the sum of |terms| (tanh
    # shrinks errors: its slope is at most 1).
    bound = 4 * np.finfo(np.float32).eps * (np.abs(f64) @ np.abs(p64))
    assert (np.abs(y - expected) <= bound).all()
    week = dx.run([dx.load("daily_scores", partition=f"2026-01-0{d}") for d in range(1, 8)])
    for i, day in enumerate(week):  # partition.index counts from the start: 0 for Jan 1
        sums = expected.sum(axis=1) * (i + 1)
        slack = (bound.sum(axis=1) + 2 * np.finfo(np.float32).eps * np.abs(sums)) * (i + 1)
        assert (np.abs(day - sums) <= slack).all(), i
    schedulers = {r.run.scheduler for r in dx.runs(limit=1000)}
    print("schedulers:", json.dumps(sorted(schedulers)))
""")


def outputs_of(nb, index: int) -> list:
    return nb.cells[index].get("outputs", [])


def stderr_of(nb, index: int) -> str:
    return "".join(o.get("text", "") for o in outputs_of(nb, index)
                   if o["output_type"] == "stream" and o["name"] == "stderr")


def html_of(nb, index: int) -> str:
    [shown] = [o for o in outputs_of(nb, index) if o["output_type"] == "execute_result"]
    return shown["data"]["text/html"]


@pytest.mark.timeout(600)
def test_the_readme_in_a_jupyter_kernel(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    db_url = f"sqlite:///{tmp_path / 'deepx.db'}"
    # The kernel inherits these: its own database, a heartbeat of 1 s, and progress shown
    # from a run's start (a quick machine could finish a run in the 2 s it waits).
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    monkeypatch.setenv("DEEPX_HEARTBEAT_S", "1")
    monkeypatch.setenv("DEEPX_PROGRESS_AFTER_S", "0")
    monkeypatch.delenv("DEEPX_SCHEDULER", raising=False)
    # Jupyter's connection files and IPython's history go here, not under the home folder.
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    # Nothing is made for the README's cells: its asset example writes its own data (in
    # data/, which does not exist yet), and fails here if it does not.
    assert not (tmp_path / "data").exists()

    new = nbformat.v4.new_code_cell
    cells = [new(readme_block("## In a notebook")), new(NOTEBOOK_CHECKS),
             new("kept = dx.persist(y, inputs={'x': x_np}).wait()")]
    cells += [new(expr) for expr in REPRS]
    first_asset = len(cells) + 1
    cells += [new("import json"), new(readme_block("## Assets")), new(ASSET_CHECKS)]
    cells += [new(expr) for expr in ["defs", "embeddings", "dx.status(defs)",
                                     "dx.runs(limit=5)"]]
    typo = len(cells)  # a misspelt name, as a new user types one
    cells += [new("try:\n    dx.reul\nexcept dx.UnknownNameError as err:\n    print(err)")]
    training = len(cells) + 1
    cells += [new(TRAINING_DATA), new(readme_block("## Training")), new(TRAINING_CHECKS),
              new(CUMSUM)]
    nb = nbformat.v4.new_notebook(cells=cells)
    client = nbclient.NotebookClient(nb, timeout=480, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()  # a cell that raises fails the test here, with its traceback
    finally:  # the notebook as run, outputs and all, to open when something fails
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, ARTIFACTS / "readme-notebook.ipynb")

    # No cell shows an error or a traceback, on stdout, stderr or as an error output.
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            assert o["output_type"] != "error", (i, o)
            assert "Traceback" not in o.get("text", ""), (i, o.get("text"))

    # Progress: the run's id and dashboard link, then tqdm's widget, which ended full.
    header = re.search(r"deepx_flow run ([0-9a-f]{32}): ([\d,]+) tasks; dashboard "
                       r"http://127\.0\.0\.1:5006/run\?id=([0-9a-f]{32})", stderr_of(nb, 0))
    assert header and header.group(1) == header.group(3), stderr_of(nb, 0)
    total = int(header.group(2).replace(",", ""))
    widgets = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in widgets.values() if m["model_name"] == "FloatProgressModel"]
    assert any(b["max"] == total and b["value"] == total for b in bars), bars
    assert any(o["output_type"] == "display_data"
               and "application/vnd.jupyter.widget-view+json" in o["data"]
               for o in outputs_of(nb, 0))
    assert "deepx_flow materialize " in stderr_of(nb, first_asset)

    # The reprs render as HTML tables.
    shown = {expr: html_of(nb, 3 + i) for i, expr in enumerate(REPRS)}
    assert "dx.Tensor" in shown["y"] and "<code>sum</code>" in shown["y"]
    assert "<table>" in shown["plan"] and "chunk shape" in shown["plan"]
    assert "dx.Persisted" in shown["kept"] and "worker" in shown["kept"]
    assert "placement of" in shown["dx.placement(kept)"]
    asset_reprs = {expr: html_of(nb, first_asset + 2 + i) for i, expr in
                   enumerate(["defs", "embeddings", "dx.status(defs)", "dx.runs(limit=5)"])}
    assert "dx.Definitions" in asset_reprs["defs"]
    assert "dx.asset &#x27;embeddings&#x27;" in asset_reprs["embeddings"]
    assert "fresh" in asset_reprs["dx.status(defs)"]
    assert "newest first" in asset_reprs["dx.runs(limit=5)"]
    said = "".join(o.get("text", "") for o in outputs_of(nb, typo))
    assert said.strip() == "dx has no attribute 'reul'; did you mean dx.relu?"

    assert "Traceback" not in stderr_of(nb, training)
    assert re.search(r"checkpoint: [0-9a-f]{32}", "".join(
        o.get("text", "") for o in outputs_of(nb, training + 1)))

    # Every run a cell started was finished by that cell: none is left running, to be
    # marked interrupted ("driver process died") by the next process (issue 30, item 10).
    from deepx_flow.meta import open_db
    from deepx_flow.meta.models import Run
    from sqlmodel import select
    with open_db(db_url).session() as session:
        runs = session.exec(select(Run)).all()
    assert {r.kind for r in runs} >= {"run", "persist", "materialize", "train", "checkpoint"}
    assert {r.status for r in runs} == {"succeeded"}, \
        sorted((r.kind, r.status, r.error) for r in runs if r.status != "succeeded")
    assert all(r.ended_at is not None for r in runs)

    # One cluster for every cell: every run the kernel recorded went to one scheduler.
    printed = "".join(o.get("text", "") for o in outputs_of(nb, first_asset + 1))
    [schedulers] = re.findall(r"schedulers: (\[.*\])", printed)
    assert len(json.loads(schedulers)) == 1
    scheduler = json.loads(schedulers)[0]

    # The kernel has stopped (nbclient shut it down): its cluster is gone from the
    # registry's listing and from the overview, and both still have it in the history.
    from deepx_flow.ui.pages.overview import registered_cluster
    db = open_db(db_url)
    overview = registered_cluster(db, None)
    assert overview.workers == [] and overview.hidden >= 1
    history = registered_cluster(db, None, history=True)
    assert history.workers and all(w["gone"] and w["scheduler"] == scheduler
                                   for w in history.workers)
    env = {**os.environ, "DEEPX_DB_URL": db_url}
    shown = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "registry", "show"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "No live cluster; 1 closed or gone on record" in shown.stdout
    every = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "registry", "show",
                            "--all"], env=env, capture_output=True, text=True, timeout=120)
    assert scheduler in every.stdout and "gone" in every.stdout
