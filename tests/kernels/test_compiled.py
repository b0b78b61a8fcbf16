"""Workers given little memory keep to the NumPy forms of the compiled kernels
(`kernels/compiled.py`: numba and LLVM take about 125 MB of a process); both forms give a
MobileNet-style block (compiled depthwise convolution, compiled elementwise programs) and
a conv net with 2x2 poolings the same bits."""

import logging

import numpy as np

import deepx_flow as dx
from deepx_flow.kernels import compiled


def _run_on(memory_limit, graph, values):
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      memory_limit=memory_limit, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        allowed = client.submit(compiled.allowed, pure=False).result()
        return allowed, dx.run(graph, inputs=values, client=client)


def test_small_workers_keep_to_numpy_and_get_the_same_bits():
    rng = np.random.default_rng(0)
    v = {"x": rng.standard_normal((64, 8, 12, 12)).astype(np.float32),
         "wd": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
         "b": rng.standard_normal(8).astype(np.float32),
         "w": rng.standard_normal((16, 8, 3, 3)).astype(np.float32)}
    t = {k: dx.input(k, a.shape, "float32") for k, a in v.items()}
    h = dx.nn.hard_swish(dx.nn.conv(t["x"], t["wd"], t["b"], padding=1, groups=8))
    out = dx.nn.max_pool(dx.nn.relu(dx.nn.conv(h, t["w"], padding=1)), 2)
    small_allowed, small = _run_on("300MiB", out, v)
    large_allowed, large = _run_on("2GiB", out, v)
    assert not small_allowed and large_allowed
    np.testing.assert_array_equal(small, large)
    assert np.array_equal(np.signbit(small), np.signbit(large))
