"""examples/asset_pipeline.py runs end to end on the embedded cluster, and leaves every
asset stored, fresh, and equal to what NumPy computes from the same inputs."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.assets.loading import load_definitions
from deepx_flow.meta.db import close_all

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "asset_pipeline.py"


@pytest.mark.timeout(300)
def test_the_asset_pipeline_example_runs_end_to_end(tmp_path, monkeypatch, client):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEEPX_DB_URL", "DEEPX_ASSET_ROOT", "DEEPX_SCHEDULER")}
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "weekly sums match: True" in done.stdout

    # Its defaults put everything under the working directory.
    db_url = f"sqlite:///{tmp_path / '.deepx' / 'deepx.db'}"
    monkeypatch.setenv("DEEPX_DB_URL", db_url)
    monkeypatch.chdir(tmp_path)
    defs = load_definitions(str(EXAMPLE))
    table = dx.status(defs, db=db_url)
    assert [r.asset for r in table.rows if r.stale] == []
    assert table["daily_activity"].partitions == (7, 7)
    raw = np.asarray(__import__("zarr").open_array(
        str(tmp_path / ".deepx" / "example" / "features.zarr"), mode="r"))
    emb = dx.run(dx.load("embeddings", db=db_url), client=client)
    proj = dx.run(dx.load("projection", db=db_url), client=client)
    np.testing.assert_allclose(emb, np.tanh(raw.astype(np.float64) @ proj.astype(np.float64)),
                               atol=2e-6)
    close_all()
