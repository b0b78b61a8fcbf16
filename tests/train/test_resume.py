"""Checkpoints and resuming: a training whose driver is killed resumes from its last
checkpoint and ends with the parameters of an uninterrupted run of the same seed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sqlmodel import select

from deepx_flow.meta import open_db
from deepx_flow.meta.db import close_all
from deepx_flow.meta.models import AssetMaterialization, Training, TrainingCheckpoint

SCRIPT = Path(__file__).with_name("train_script.py")


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DEEPX_SCHEDULER"}
    env["DEEPX_DB_URL"] = f"sqlite:///{tmp_path / 'deepx.db'}"
    env["DEEPX_ASSET_ROOT"] = str(tmp_path / "assets")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def _run(tmp_path, asset, out):
    done = subprocess.run([sys.executable, str(SCRIPT), asset, str(out)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.timeout(600)
def test_a_killed_driver_resumes_from_its_checkpoint_and_ends_as_an_unbroken_run(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'deepx.db'}"
    killed = subprocess.Popen([sys.executable, str(SCRIPT), "mlp", str(tmp_path / "a.npz")],
                              env=_env(tmp_path), start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Kill the driver and its embedded cluster once two checkpoints are stored.
    deadline = time.monotonic() + 300
    steps = []
    while time.monotonic() < deadline and killed.poll() is None:
        time.sleep(0.2)
        if not (tmp_path / "deepx.db").exists():
            continue
        try:
            with open_db(db_url).read() as s:
                steps = s.exec(select(TrainingCheckpoint.step)).all()
        except Exception:  # the database is still being made
            continue
        if len(steps) >= 2:
            os.killpg(killed.pid, signal.SIGKILL)
            break
    killed.wait(60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.read()[-2000:]
    assert not (tmp_path / "a.npz").exists()
    close_all()

    resumed = _run(tmp_path, "mlp", tmp_path / "a.npz")
    unbroken = _run(tmp_path, "mlp_unbroken", tmp_path / "b.npz")
    assert resumed.keys() == unbroken.keys()
    for k in resumed:
        np.testing.assert_array_equal(resumed[k], unbroken[k])

    with open_db(db_url).read() as s:
        trainings = {t.asset: t for t in s.exec(select(Training)) if t.status == "succeeded"}
        first = [t for t in s.exec(select(Training)) if t.status == "running"]
        versions = s.exec(select(AssetMaterialization.version).where(
            AssetMaterialization.asset == "mlp")).all()
    # The killed training stays "running"; the one that resumed says where it started.
    assert len(first) == 1
    again = trainings["mlp"]
    assert again.resumed_from in versions and again.steps_done == again.steps == 200
    assert trainings["mlp_unbroken"].resumed_from is None
    assert max(steps) < 200
    close_all()
