"""An ONNX model's values while it converts (a tensor of the graph, or a constant known now)
and the context a converter works in; the NumPy dtype of an ONNX element type. What the
loader (`model.py`) and every converter (`ops.py`, `ml_*.py`) share."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from deepx_flow.errors import SpecError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node
from deepx_flow.sdk.tensor import Tensor
from deepx_flow.storage.weights import STORED_CONSTANT_BYTES, content_digest, stored_weight


def _onnx():
    try:
        import onnx
    except ImportError:  # the optional extra is missing
        raise SpecError("reading ONNX models needs the onnx package: pip install "
                        "'deepx-flow[onnx]'") from None
    return onnx


def numpy_dtype(elem_type: int, where: str) -> np.dtype:
    """The NumPy dtype of an ONNX tensor element type deepx_flow computes in."""
    onnx = _onnx()
    from deepx_flow.ir import dtypes
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.name not in dtypes.DTYPES:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in \
            onnx.TensorProto.DataType.values() else str(elem_type)
        raise SpecError(f"{where}: data type {name} is not supported (supported: "
                        f"{', '.join(dtypes.DTYPES)})")
    return dtype


@dataclass
class Value:
    """An ONNX value while converting: a tensor of the graph, or a constant known now."""

    tensor: Tensor | None = None
    const: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape) if self.tensor is not None else self.const.shape

    @property
    def dtype(self) -> str:
        return self.tensor.dtype if self.tensor is not None else self.const.dtype.name


@dataclass
class Context:
    """What converting one call of a model builds: its values and the constants' data."""

    node: object = None  # the ONNX NodeProto being converted
    values: dict[str, Value] = field(default_factory=dict)
    bound: dict[str, np.ndarray] = field(default_factory=dict)  # input name -> array
    opsets: dict[str, int] = field(default_factory=dict)  # domain ("ai.onnx.ml") -> version

    def where(self) -> str:
        n = self.node
        return f"ONNX node {shown(n.name or n.output[0])} ({n.op_type})"

    def error(self, message: str) -> SpecError:
        return SpecError(f"{self.where()}: {message}")

    def tensor(self, value: Value) -> Tensor:
        """`value` as a tensor of the graph: a constant becomes a scalar `full` node, or a
        named input carrying its array (named by its content, so equal constants share one),
        which every run, persist, asset and export of the tensors built on it binds without
        being told (`sdk/bindings.py`): one data task per chunk, fetched once per worker."""
        if value.tensor is not None:
            return value.tensor
        import deepx_flow as dx
        from deepx_flow.sdk.bindings import bound_tensor
        array = value.const
        if array.ndim == 0:
            return dx.full((), array.item(), dtype=array.dtype.name)
        digest = content_digest(array)
        name = f"onnx_const_{digest[:12]}"
        array = self.bound.setdefault(name, array)
        node = Node(name, "input", (), tuple(int(s) for s in array.shape),
                    dtypes.normalize(array.dtype))
        if array.nbytes >= STORED_CONSTANT_BYTES:
            path = stored_weight(array, digest)
            if path is not None:
                return bound_tensor(node, path, f"onnx-{digest}")
        return bound_tensor(node, array, f"onnx-{digest}")
