"""A served model: an ONNX file read, checked and kept, answering batches of inference
requests with deepx_flow's kernels.

Loading reads the file (its SHA-256 is the version's digest), checks it as `dx.onnx.load`
does (ONNX's checker, shape inference, every operator one deepx_flow converts), and builds
its graph once for a batch of one, so a model whose graph does not take its declared inputs
is refused at load, by name, and never served. Each request's inputs are checked against
the declared ones (names, datatypes, ranks, fixed sizes) before anything runs; a graph is
built and compiled once per distinct set of input shapes (a batch size, for most models)
and kept, so a batch costs its kernels and little else (`execute.run_here`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepx_flow.contract.tensors import datatype_of
from deepx_flow.errors import DeepxError, InputError, shown

PLATFORM = "deepx_flow_onnx"
BUILT_SHAPES = 64  # graphs kept per model (one per distinct set of input shapes)


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as the protocol's metadata says it: -1 for a size that
    varies (the batch axis)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def answer(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


class ServedModel:
    """Version `version` of model `name`, read from the ONNX file at `path`, computed for
    `cluster` (a ClusterSpec: the worker it runs on)."""

    def __init__(self, name: str, version: str, path: Path, cluster):
        import deepx_flow as dx
        self.name, self.version, self.path, self.cluster = name, version, Path(path), cluster
        self.digest = _sha256(self.path)
        self.onnx = dx.onnx.load(self.path)
        types = self.onnx.input_types
        self.inputs = [TensorSpec(n, datatype_of(types[n][1]),
                                  tuple(-1 if d is None else d for d in types[n][0]))
                       for n in self.onnx.input_names]
        self._lock = threading.Lock()
        self._built: OrderedDict = OrderedDict()
        # built once for a batch of one: a graph that does not take its declared inputs is
        # refused now, and the outputs' datatypes and shapes are known
        probe = {s.name: np.zeros(tuple(1 if d == -1 else d for d in s.shape),
                                  dtype=_dtype(s.datatype)) for s in self.inputs}
        graph, _ = self._graph(probe)
        declared = self.onnx.output_types
        self.outputs = []
        for name, node_id in graph.outputs:
            node = graph[node_id]
            dims = declared.get(name)[0] if declared.get(name) else node.shape
            self.outputs.append(TensorSpec(name, datatype_of(node.dtype),
                                           tuple(-1 if d is None else d for d in dims)))

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.version], "platform": PLATFORM,
                "inputs": [s.answer() for s in self.inputs],
                "outputs": [s.answer() for s in self.outputs]}

    def infer(self, arrays: dict, outputs: list | None = None) -> dict[str, np.ndarray]:
        """The outputs (all, or those named) for `arrays` (input name -> array): checked
        against the declared inputs first, each mistake one InputError naming it."""
        from deepx_flow.serving.execute import run_here
        from deepx_flow.runtime.inputs import bind_inputs
        wanted = self.check(arrays, outputs)
        graph, carried = self._graph(arrays)
        results = run_here(graph, bind_inputs(graph, {**carried, **arrays}), self.cluster)
        return {n: results[n] for n in wanted}

    def check(self, arrays: dict, outputs: list | None = None) -> list[str]:
        """Names, datatypes, ranks and fixed sizes of a request's inputs, and the outputs
        it asks for (all when None): those outputs' names."""
        names = [s.name for s in self.outputs]
        wanted = list(outputs) if outputs else names
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise InputError(f"model {self.name!r} has no output(s) "
                             f"{', '.join(map(shown, unknown))} (its outputs: "
                             f"{', '.join(names)})")
        declared = {s.name: s for s in self.inputs}
        unknown = sorted(set(arrays) - set(declared))
        missing = [n for n in declared if n not in arrays]
        if unknown or missing:
            raise InputError(f"model {self.name!r}: " + "; ".join(
                ([f"no input(s) {', '.join(map(shown, unknown))}"] if unknown else []) +
                ([f"input(s) {', '.join(map(shown, missing))} not given"] if missing else []))
                + f" (its inputs: {', '.join(declared)})")
        for name, array in arrays.items():
            spec = declared[name]
            given = datatype_of(array.dtype)
            if given != spec.datatype:
                raise InputError(f"model {self.name!r}: input {name!r} is {spec.datatype}, "
                                 f"not {given}")
            if len(array.shape) != len(spec.shape) or any(
                    d != -1 and d != a for d, a in zip(spec.shape, array.shape)):
                raise InputError(f"model {self.name!r}: input {name!r} has shape "
                                 f"{list(spec.shape)} (-1: any size), not "
                                 f"{list(array.shape)}")
        return wanted

    def _graph(self, arrays: dict):
        """The checked graph for inputs of these shapes, and the weights it carries: built
        once per set of shapes, the most recent BUILT_SHAPES kept."""
        from deepx_flow.compiler.infer import infer_types
        from deepx_flow.compiler.validate import validate_graph
        from deepx_flow.sdk.bindings import bound_inputs
        from deepx_flow.sdk.build import build_graph
        from deepx_flow.sdk.functions import input as input_
        key = tuple((n, arrays[n].shape) for n in sorted(arrays))
        with self._lock:
            if key in self._built:
                self._built.move_to_end(key)
                return self._built[key]
        tensors = {n: input_(n, arrays[n].shape, arrays[n].dtype) for n in arrays}
        try:
            outs = self.onnx(**tensors)
            graph = infer_types(validate_graph(build_graph(outs)))
        except DeepxError as err:
            raise InputError(f"model {self.name!r}: {err}") from None
        built = (graph, dict(bound_inputs(outs)))
        with self._lock:
            self._built[key] = built
            while len(self._built) > BUILT_SHAPES:
                self._built.popitem(last=False)
        return built


def _dtype(datatype: str) -> np.dtype:
    from deepx_flow.contract.tensors import dtype_of
    return np.dtype(dtype_of(datatype, "probe"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as err:
        raise InputError(f"{path}: cannot be read: {err}") from None
    return h.hexdigest()
