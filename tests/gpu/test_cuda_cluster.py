"""A graph run on a dask-cuda `LocalCUDACluster` (one worker per GPU) equals NumPy.

Skips without CuPy, dask-cuda or a visible CUDA device (see conftest.py). The registry must
see the GPU (its memory becomes the budget), source chunks must be made on the device, and
results must come back to the host as NumPy arrays.
"""

import logging

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
dask_cuda = pytest.importorskip("dask_cuda")

import deepx_flow as dx  # noqa: E402
from distributed import Client  # noqa: E402


@pytest.fixture(scope="module")
def cuda_client():
    cluster = dask_cuda.LocalCUDACluster(dashboard_address="127.0.0.1:0",
                                         silence_logs=logging.ERROR)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


def test_registry_sees_the_gpu(cuda_client):
    from deepx_flow.runtime.run import cluster_spec
    spec = cluster_spec(client=cuda_client)
    assert spec.has_devices
    total = cupy.cuda.Device(0).mem_info[1]
    # NVML's total (registered) and CUDA's may differ by what the driver keeps back.
    assert all(w.device and abs(w.device.memory - total) <= 2**30 for w in spec.workers)
    assert all(0 < w.device.usable < total for w in spec.workers)  # less others, a reserve


def test_mlp_layer_on_gpu_equals_numpy(cuda_client):
    x_np = np.random.default_rng(0).standard_normal((20_000, 512), dtype="float32")
    x = dx.input("x", x_np.shape, "float32")
    w = dx.random.normal((512, 1024), seed=0, dtype="float32")
    y = dx.relu(x @ w + 1.0).sum(axis=1)
    z = dx.softmax(dx.gelu(x[:, :64] * 0.5), axis=1).mean(axis=0)
    got_y, got_z, w_np = dx.run([y, z, w], inputs={"x": x_np}, client=cuda_client)
    assert isinstance(got_y, np.ndarray) and isinstance(w_np, np.ndarray)
    x64 = x_np.astype("float64")
    ref_y = np.maximum(x64 @ w_np.astype("float64") + 1.0, 0).sum(axis=1)
    np.testing.assert_allclose(got_y, ref_y, rtol=2e-4, atol=1e-2)
    g = x64[:, :64] * 0.5
    g = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    e = np.exp(g - g.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got_z, (e / e.sum(axis=1, keepdims=True)).mean(axis=0),
                               rtol=1e-4)


def test_random_tensors_match_between_cpu_and_gpu(cuda_client):
    r = dx.random.normal((1000, 37), seed=5, dtype="float64")
    on_gpu = dx.run(r, client=cuda_client)
    on_cpu = dx.run(r)
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-12, atol=1e-12)


def test_the_embedded_cluster_budgets_the_registered_usable_memory():
    """deepx_flow's own LocalCUDACluster: started with the RMM pool (where RMM is installed)
    and spilling settings from NVML's usable memory, it registers that memory as each GPU's
    budget, and computes right within it."""
    from deepx_flow.registry.gpu_memory import probe_all_nvml
    from deepx_flow.runtime.cluster import start_embedded_cluster
    from deepx_flow.runtime.run import cluster_spec
    gpus, why = probe_all_nvml()
    assert gpus, why
    with start_embedded_cluster() as cluster, Client(cluster) as client:
        spec = cluster_spec(client=client)
        assert spec.has_devices
        for w in spec.workers:
            assert 2**30 < w.device.usable <= w.device.memory and w.budget == w.device.usable
        x_np = np.random.default_rng(1).standard_normal((50_000, 256), dtype="float32")
        x = dx.input("x", x_np.shape, "float32")
        out = dx.run(dx.tanh(x * 0.5).sum(axis=0), inputs={"x": x_np}, client=client)
        expected = np.tanh(x_np.astype(np.float64) * 0.5).sum(axis=0)
        np.testing.assert_allclose(out, expected, rtol=0,
                                   atol=1e-5 * np.abs(np.tanh(x_np * 0.5)).sum(axis=0).max())
