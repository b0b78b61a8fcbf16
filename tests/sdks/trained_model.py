"""A model trained and packaged in Python, served by a real gateway, for the SDKs to call: a
classifier of scikit-learn's bundled iris flowers, trained with `dx.train` and written by
`dx.serving.package`, with the answer Python's Open Inference Protocol client (tritonclient)
gets for some rows. Each SDK's test calls the same model on the same rows and must get that
answer (`trained` is a module-scoped fixture; import it into a test module)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from tests.gateway.test_serve import Served

MODEL = "iris"


@dataclass
class TrainedModel:
    url: str  # the gateway's HTTP base URL
    grpc: str  # its gRPC address (host:port)
    model: str  # the served model's name
    input: str  # its input's name
    output: str  # its output's name
    x: np.ndarray  # rows to classify, float32 (n, 4)
    want: np.ndarray  # the class probabilities Python's client got for them, float32 (n, 3)


def _train_and_package(repository) -> None:
    from sklearn.datasets import load_iris

    import deepx_flow as dx
    features, labels = load_iris(return_X_y=True)
    x = ((features - features.mean(0)) / features.std(0)).astype(np.float32)
    net = dx.nn.Sequential(dx.nn.Linear(4, 8, dtype="float32"), dx.relu,
                           dx.nn.Linear(8, 3, dtype="float32"))
    fit = dx.train(lambda p, a, b: dx.nn.cross_entropy(net(p, a), b), net.init(seed=2),
                   data=(x, labels.astype(np.int64)), batch_size=30, epochs=3,
                   progress=False)
    dx.serving.package(MODEL, lambda p, x: dx.softmax(net(p, x), axis=1), fit,
                       example_inputs={"x": x[:1]}, repository=repository)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    import tritonclient.http as httpclient

    root = tmp_path_factory.mktemp("trained-model")
    _train_and_package(root / "models")
    server = Served(root, "--model-repository", str(root / "models"))
    try:
        rows = np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32)
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        meta = client.get_model_metadata(MODEL)
        [given], [made] = meta["inputs"], meta["outputs"]
        request = httpclient.InferInput(given["name"], list(rows.shape), "FP32")
        request.set_data_from_numpy(rows, binary_data=True)
        want = client.infer(MODEL, [request]).as_numpy(made["name"])
        # (Python's answer is a classifier's: rows of probabilities)
        assert want.shape == (6, 3) and np.allclose(want.sum(1), 1, atol=1e-6)
        yield TrainedModel(server.url, server.grpc, MODEL, given["name"], made["name"],
                           rows, want)
    finally:
        assert server.stop() == 0
