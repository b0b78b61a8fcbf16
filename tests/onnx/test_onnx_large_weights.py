"""A model's large weights are bound as `.npy` files that each task reads its region of
(`storage/weights.py`): an imported model whose weights are twice a worker's memory runs on
4 workers and equals ONNX Runtime, and served (imported, or packaged with
`dx.serving.package`) answers the same."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.storage.weights import STORED_CONSTANT_BYTES  # noqa: E402
from deepx_flow.sdk.bindings import bound_inputs, carried_array  # noqa: E402
from tests.helpers import worker_memory_sampled  # noqa: E402

LIMIT = 512 * 2**20


def _mlp_model(path, weights: list[np.ndarray]) -> str:
    """x @ w0, relu, @ w1, relu, ... (no relu after the last)."""
    nodes, previous = [], "x"
    for i in range(len(weights)):
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [f"m{i}"]))
        previous = f"m{i}"
        if i < len(weights) - 1:
            nodes.append(helper.make_node("Relu", [previous], [f"r{i}"]))
            previous = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                     [None, weights[0].shape[0]])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT,
                                       [None, weights[-1].shape[1]])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _runtime(path, x):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _close(got, expected, terms):
    # float32 sums of `terms` products: an absolute tolerance scaled by the sum's terms
    scale = np.sqrt(terms) * np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * scale)


def test_a_large_weight_is_bound_as_a_file_and_reads_the_same(client, tmp_path):
    rng = np.random.default_rng(0)
    big = (rng.standard_normal((2048, 2048)) / 45).astype(np.float32)  # 16 MiB
    small = (rng.standard_normal((2048, 8)) / 45).astype(np.float32)
    assert big.nbytes >= STORED_CONSTANT_BYTES > small.nbytes
    path = _mlp_model(str(tmp_path / "mlp.onnx"), [big, small])
    x = rng.standard_normal((5, 2048)).astype(np.float32)
    model = dx.onnx.load(path)
    out = model(x=dx.input("x", x.shape, "float32"))[model.output_names[0]]
    kinds = sorted(b.kind for b in bound_inputs(out).values())
    assert kinds == ["NumPy array", "file"]
    for binding in bound_inputs(out).values():
        if binding.kind == "file":  # the file holds the weight itself
            np.testing.assert_array_equal(carried_array(binding), big)
    _close(dx.run(out, inputs={"x": x}, client=client), _runtime(path, x), 2048)
    # the model's inputs stay arrays, for a spec of the graph
    assert all(isinstance(a, np.ndarray) for a in model.inputs.values())


def test_a_model_served_whole_maps_its_weights_file_once(tmp_path):
    """In the gateway's process (a model that fits: no chunked plan) a weight bound as its
    file is mapped once, not read again by every call's tasks; the answers equal ONNX
    Runtime's."""
    import cloudpickle

    from deepx_flow.runtime.inputs import load_region
    from deepx_flow.runtime.run import cluster_spec
    from deepx_flow.serving.model import load_model
    rng = np.random.default_rng(3)
    big = (rng.standard_normal((2048, 2048)) / 45).astype(np.float32)
    small = (rng.standard_normal((2048, 8)) / 45).astype(np.float32)
    path = _mlp_model(str(tmp_path / "mlp.onnx"), [big, small])
    model = load_model("mlp", "1", Path(path), cluster_spec())
    for rows in (1, 5):
        x = rng.standard_normal((rows, 2048)).astype(np.float32)
        _close(model.infer({"x": x})[model.outputs[0].name], _runtime(path, x), 2048)
    executable = model._executable({"x": x})
    # no task reads the file, alone or inside the task that uses it (pickled by name)
    assert not any(load_region.__name__.encode() in cloudpickle.dumps(node)
                   for _, node, _ in executable.steps)


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
