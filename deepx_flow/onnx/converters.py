"""Every ONNX converter, registered: the ONNX operators (`ops.py`) and scikit-learn's domain,
ai.onnx.ml (`ml_ops.py`, `ml_svm.py`, `ml_trees.py`). Import the tables from here: a
converter module alone registers only its own."""

from deepx_flow.onnx import ml_ops, ml_svm, ml_trees, ops  # noqa: F401  (they register)
from deepx_flow.onnx.registry import REFUSED, SUPPORTED

__all__ = ["REFUSED", "SUPPORTED"]
