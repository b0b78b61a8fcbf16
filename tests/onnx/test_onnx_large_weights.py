"""A model's large weights are bound as `.npy` files that each task reads its region of
(`storage/weights.py`), and read the same; a model served whole maps the file once. Models
larger than a worker: `tests/serving/test_models_larger_than_a_worker.py`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.storage.weights import STORED_CONSTANT_BYTES  # noqa: E402
from deepx_flow.sdk.bindings import bound_inputs, carried_array  # noqa: E402


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
