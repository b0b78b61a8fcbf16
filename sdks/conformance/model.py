"""The served model the conformance suite calls: a small ONNX classifier (4 features, 8
hidden units, 3 classes, softmax) with fixed weights, and its answer in NumPy float64.

    python sdks/conformance/model.py REPOSITORY   # write REPOSITORY/classifier/1/model.onnx

run.sh writes it into the gateway's model repository; make_scenarios.py stores what it must
answer for some rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

NAME = "classifier"


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(34)
    return {"W1": rng.uniform(-1, 1, (4, 8)).astype(np.float32),
            "b1": rng.uniform(-0.5, 0.5, 8).astype(np.float32),
            "W2": rng.uniform(-1, 1, (8, 3)).astype(np.float32),
            "b2": rng.uniform(-0.5, 0.5, 3).astype(np.float32)}


def write(repository: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("Gemm", ["a", "W2", "b2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, NAME, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(a, n) for n, a in weights().items()])
    path = Path(repository) / NAME / "1" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    return path


def answer(x: np.ndarray) -> np.ndarray:
    """The model's output for rows `x`, in float64."""
    w = {n: a.astype(np.float64) for n, a in weights().items()}
    logits = np.maximum(x @ w["W1"] + w["b1"], 0) @ w["W2"] + w["b2"]
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


if __name__ == "__main__":
    write(Path(sys.argv[1]))
