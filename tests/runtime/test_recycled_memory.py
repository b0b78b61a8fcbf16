"""Runs on recycled memory (`kernels/recycled.py`) give the right answers run after run: a
stored chunk read once and shared by three reductions, fused outputs and matmul tiles all
come from pooled buffers, and the second and third runs reuse the first run's buffers."""

import numpy as np
import zarr

import deepx_flow as dx
from deepx_flow.kernels import recycled


def test_repeated_runs_on_recycled_buffers_match_numpy(client, tmp_path):
    rows, cols = 49_152, 256  # 48 MiB of float32 in stored chunks of 8 MiB
    rng = np.random.default_rng(7)
    data = rng.standard_normal((rows, cols), dtype=np.float32) * 3 + 1
    path = str(tmp_path / "x.zarr")
    zarr.create_array(path, shape=data.shape, chunks=(8192, cols), dtype="float32")[...] = data

    x = dx.read_zarr(path)
    mean = x.mean(axis=0)
    centered = x - mean
    var = (centered * centered).mean(axis=0)
    third = ((centered / dx.sqrt(var)) ** 3).mean(axis=0)
    scaled = dx.tanh(x * 0.5) + x  # a chunk-sized fused output per task
    gram = dx.transpose(x) @ x

    d = data.astype(np.float64)
    m = d.mean(axis=0)
    c = d - m
    v = (c * c).mean(axis=0)
    expected = {"third": ((c / np.sqrt(v)) ** 3).mean(axis=0),
                "scaled": np.tanh(d * 0.5) + d, "gram": d.T @ d}
    terms = np.abs(d).T @ np.abs(d)
    pool = recycled.pool()
    made = [pool.made]
    for _ in range(3):
        got = dx.run({"third": third, "scaled": scaled, "gram": gram}, client=client)
        np.testing.assert_allclose(got["third"], expected["third"], rtol=0, atol=1e-4)
        np.testing.assert_allclose(got["scaled"], expected["scaled"], rtol=1e-6, atol=1e-6)
        # |x^T x| terms are about 10 * rows; float32 products summed in float32 tiles
        assert (np.abs(got["gram"] - expected["gram"]) <= 1e-5 * terms).all()
        made.append(pool.made)
    first, later = made[1] - made[0], made[3] - made[1]
    assert first > 0 and later < first  # later runs took buffers the first one freed
