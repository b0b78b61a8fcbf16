"""Outputs too large for this process are refused before the run, with what to do instead;
`Persisted.to_zarr` is that way out."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.runtime import cluster as embedded
from deepx_flow.runtime.run import GATHER_BATCH_BYTES, check_gatherable, driver_memory


def test_a_result_larger_than_memory_is_refused_before_any_cluster_starts():
    rows = 2 * driver_memory() // (1024 * 8)  # twice what this process could take
    y = dx.zeros((rows, 1024), dtype="float64") + 1.0
    before = dict(embedded._shared)
    with pytest.raises(dx.PlanError) as caught:
        dx.run({"big": y, "small": y.sum()})
    message = str(caught.value)
    assert f"'big' of shape ({rows}, 1024) float64" in message
    assert "dx.persist" in message and ".to_zarr" in message and "dx.asset" in message
    assert dict(embedded._shared) == before  # nothing was started for it


def test_the_limit_counts_every_output_and_a_batch_in_flight():
    available = 2**30
    check_gatherable({"a": ((2**28,), "int16")}, available=available)  # half of it: fine
    with pytest.raises(dx.PlanError, match="'a' of shape"):
        check_gatherable({"a": ((2**29,), "uint8"), "b": ((2**27 + 1,), "float32")},
                         available=available)
    # The outputs plus one batch of chunks in flight must fit.
    just = available - GATHER_BATCH_BYTES
    check_gatherable({"a": ((just,), "uint8")}, available=available)
    with pytest.raises(dx.PlanError, match="only 1.0 GiB of memory is available"):
        check_gatherable({"a": ((just + 1,), "uint8")}, available=available)
    with pytest.raises(dx.PlanError, match="bfloat16"):  # 2 bytes each
        check_gatherable({"a": ((2**29,), "bfloat16")}, available=available)
    check_gatherable({"a": ((2**28,), "bfloat16")}, available=available)


def test_persist_then_to_zarr_writes_it_where_the_chunks_are(tmp_path, client):
    x = dx.input("x", shape=(3000, 40), dtype="float32")
    data = np.random.default_rng(1).standard_normal((3000, 40), dtype="float32")
    kept = dx.persist(dx.tanh(x) * 2.0, inputs={"x": data}, client=client)
    info = kept.to_zarr(tmp_path / "y.zarr")
    assert info["shape"] == [3000, 40] or tuple(info["shape"]) == (3000, 40)
    back = dx.run(dx.read_zarr(str(tmp_path / "y.zarr")), client=client)
    np.testing.assert_array_equal(back, np.tanh(data) * np.float32(2.0))
    np.testing.assert_allclose(back, np.tanh(data.astype(np.float64)) * 2.0, rtol=1e-6)
    kept.release()


def test_the_cli_refuses_it_with_exit_code_2(tmp_path):
    rows = 2 * driver_memory() // (1024 * 8)
    spec = tmp_path / "big.yaml"
    dx.to_yaml({"y": dx.ones((rows, 1024), dtype="float64") * 3.0}, spec)
    done = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "run", str(spec),
                           "--db", f"sqlite:///{tmp_path}/deepx.db"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("deepx-flow: error: ") and "Traceback" not in done.stderr
    assert "'y' of shape" in done.stderr and "dx.persist" in done.stderr
