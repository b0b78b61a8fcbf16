"""An ONNX model's values while it converts (a tensor of the graph, or a constant known now)
and the context a converter works in; the NumPy dtype of an ONNX element type. What the
loader (`model.py`) and every converter (`ops.py`, `ml_*.py`) share."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from deepx_flow.errors import SpecError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node
from deepx_flow.sdk.tensor import Tensor


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


# Constants at least this large (a model's weights) are bound as `.npy` files, which each
# task reads its region of where it runs: bound as arrays, every chunk of every weight would
# travel inside the graph and be sent to the workers at once, and a model whose weights
# outgrow a worker's memory could not run.
STORED_CONSTANT_BYTES = 16 * 2**20


def stored_weight(array: np.ndarray, digest: str) -> str | None:
    """The `.npy` file holding `array` under the asset root's `onnx-weights/` (written once,
    named by its content, renamed into place whole so no reader sees part of it); None
    where the asset root is not a local folder (the array is then bound as it is)."""
    import os
    import tempfile
    from pathlib import Path

    from deepx_flow.assets.root import asset_root
    root = asset_root()
    if "://" in root:
        return None
    folder = Path(root).resolve() / "onnx-weights"  # absolute: workers run elsewhere
    path = folder / f"{digest}.npy"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, np.ascontiguousarray(array))
            # readable as any file written here is (mkstemp's are the owner's alone), for
            # workers running as another user on shared storage
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            if not path.exists():  # another process may have put the same file in place
                raise
    return str(path)


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
        digest = hashlib.sha1(array.dtype.str.encode() + str(array.shape).encode()
                              + np.ascontiguousarray(array).tobytes()).hexdigest()
        name = f"onnx_const_{digest[:12]}"
        array = self.bound.setdefault(name, array)
        node = Node(name, "input", (), tuple(int(s) for s in array.shape),
                    dtypes.normalize(array.dtype))
        if array.nbytes >= STORED_CONSTANT_BYTES:
            path = stored_weight(array, digest)
            if path is not None:
                return bound_tensor(node, path, f"onnx-{digest}")
        return bound_tensor(node, array, f"onnx-{digest}")
