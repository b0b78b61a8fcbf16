"""Models whose weights are twice a worker's memory, on 4 workers of 512 MiB: an imported
ONNX model runs and equals ONNX Runtime, and served (imported, or packaged with
`dx.serving.package`) answers the same over the Open Inference Protocol, each task reading
its region of the weights' files (`storage/weights.py`). Clusters of processes and a
server: not among the tests that run two at a time."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import deepx_flow as dx
from tests.helpers import worker_memory_sampled
from tests.onnx.test_onnx_large_weights import _close, _mlp_model, _runtime

LIMIT = 512 * 2**20

N = 8192  # four N x N float32 weights: 1 GiB, twice a worker's limit


def _large_weights() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((N, N), dtype=np.float32) / np.float32(90)) for _ in range(4)]


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """The model's file, an input, and ONNX Runtime's answer."""
    weights = _large_weights()
    assert sum(w.nbytes for w in weights) >= 2 * LIMIT
    path = _mlp_model(str(tmp_path_factory.mktemp("large") / "large.onnx"), weights)
    del weights
    x = np.random.default_rng(2).standard_normal((8, N)).astype(np.float32)
    return path, x, _runtime(path, x)


@pytest.fixture(scope="module")
def client4():
    """4 workers of LIMIT each."""
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, host="127.0.0.1",
                      memory_limit=LIMIT, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        yield client


@pytest.mark.timeout(900)
def test_weights_twice_a_workers_memory_run_and_equal_onnx_runtime(large, client4):
    path, x, expected = large
    with worker_memory_sampled(client4) as peak:
        model = dx.onnx.load(path)
        out = model(x=dx.input("x", x.shape, "float32"))[model.output_names[0]]
        got = dx.run(out, inputs={"x": x}, client=client4)
    _close(got, expected, N)
    assert len(peak) == 4 and max(peak.values()) < LIMIT, {k: v / 2**20 for k, v in
                                                           peak.items()}


@pytest.mark.timeout(900)
def test_models_twice_a_workers_memory_imported_and_packaged_serve_as_onnx_runtime(
        large, client4, tmp_path):
    """`deepx-flow serve` on those workers, its repository holding the ONNX file and the
    same MLP packaged by `dx.serving.package` (its weights in `weights.npz`): no replica can
    hold either, so their requests run as chunked plans on the cluster, each task reading
    its region of the weights' files; both answers over the Open Inference Protocol equal
    ONNX Runtime's, and no worker goes past its memory."""
    import re
    import shutil

    import httpx
    import tritonclient.http as httpclient

    from tests.gateway.test_serve import Served
    path, x, expected = large
    models = tmp_path / "models"
    (models / "imported" / "1").mkdir(parents=True)
    shutil.copy(path, models / "imported" / "1" / "model.onnx")

    def forward(p, x):
        for i in range(4):
            x = x @ p[f"w{i}"]
            x = dx.relu(x) if i < 3 else x
        return x

    weights = {f"w{i}": w for i, w in enumerate(_large_weights())}
    dx.serving.package("packaged", forward, weights, {"x": x[:1]}, models,
                       db=f"sqlite:///{tmp_path / 'package.db'}")
    del weights
    served = Served(tmp_path, "--model-repository", str(models), "--scheduler",
                    client4.scheduler.address)
    got = {}
    try:
        client = httpclient.InferenceServerClient(
            url=served.url.removeprefix("http://"), network_timeout=600,
            connection_timeout=600)
        given = httpclient.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x, binary_data=True)
        with worker_memory_sampled(client4) as peak:
            for model, output in (("imported", "m3"), ("packaged", "output")):
                assert client.is_model_ready(model), model
                got[model] = client.infer(model, [given]).as_numpy(output)
        metrics = httpx.get(served.metrics + "/metrics", timeout=60).text
    finally:
        assert served.stop() == 0
    for model in ("imported", "packaged"):
        _close(got[model], expected, N)
        # run as a chunked plan on the cluster (no replica holds it)
        assert re.search(rf'deepx_inference_chunked_total{{model="{model}"[^}}]*}} 1\.0',
                         metrics), metrics
    assert len(peak) == 4 and max(peak.values()) < LIMIT, {k: v / 2**20 for k, v in
                                                           peak.items()}
