"""A served model: an ONNX file, or a graph spec with bound weights, read, checked and
kept, answering batches of inference requests with deepx_flow's kernels.

Loading reads the file (its SHA-256 is the version's digest), checks it as `dx.onnx.load`
does (ONNX's checker, shape inference, every operator one deepx_flow converts), and builds
its graph once for a batch of one, so a model whose graph does not take its declared inputs
is refused at load, by name, and never served. Each request's inputs are checked against
the declared ones (names, datatypes, ranks, fixed sizes) before anything runs; a graph is
built and compiled once per distinct set of input shapes (a batch size, for most models)
and kept, prepared to run, so a batch costs its kernels and little else
(`execute.Executable`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepx_flow.contract.tensors import datatype_of
from deepx_flow.errors import DataError, DeepxError, InputError, shown

log = logging.getLogger(__name__)

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
    """Version `version` of model `name`, read from `path`, computed for `cluster` (a
    ClusterSpec: the worker it runs on). A flavour (`OnnxModel`, `SpecModel`) says what its
    inputs are and builds its outputs over tensors of a request's shapes."""

    platform = PLATFORM

    def __init__(self, name: str, version: str, path: Path, cluster, inputs: list):
        self.name, self.version, self.path, self.cluster = name, version, Path(path), cluster
        self.inputs = inputs
        self._lock = threading.Lock()
        self._built: OrderedDict = OrderedDict()
        self._executables: OrderedDict = OrderedDict()
        self._output_bytes: OrderedDict = OrderedDict()  # (kept: read for every request)
        # built once for a batch of one: a graph that does not take its declared inputs is
        # refused now, and the outputs' datatypes and shapes are known
        probe = {s.name: np.zeros(tuple(1 if d == -1 else d for d in s.shape),
                                  dtype=_dtype(s.datatype)) for s in self.inputs}
        graph, carried = self._graph(probe)
        self.outputs = [TensorSpec(name, datatype_of(graph[node_id].dtype),
                                   self._output_shape(name, graph[node_id].shape))
                        for name, node_id in graph.outputs]
        # what running the model whole holds besides a request: its weights
        self.weight_bytes = _input_bytes(graph, carried)

    def _build(self, tensors: dict) -> tuple[dict, dict]:
        """The outputs (name -> Tensor) over `tensors` (input name -> dx.input), and arrays
        to bind besides the request's (name -> array)."""
        raise NotImplementedError

    def _output_shape(self, name: str, built: tuple) -> tuple:
        """An output's shape as the metadata says it (-1 where it varies)."""
        return built

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.version], "platform": self.platform,
                "inputs": [s.answer() for s in self.inputs],
                "outputs": [s.answer() for s in self.outputs]}

    def infer(self, arrays: dict, outputs: list | None = None) -> dict[str, np.ndarray]:
        """The outputs (all, or those named) for `arrays` (input name -> array): checked
        against the declared inputs first, each mistake one InputError naming it."""
        wanted = self.check(arrays, outputs)
        results = self._executable(arrays)(arrays)
        return {n: results[n] for n in wanted}

    def _executable(self, arrays: dict):
        """The graph for inputs of these shapes, prepared to run (`execute.Executable`)."""
        from deepx_flow.serving.execute import Executable
        return self._kept(self._executables, arrays,
                          lambda: Executable(*self._graph(arrays), self.cluster))

    def _kept(self, cache: OrderedDict, arrays: dict, make):
        """`make()` for inputs of these shapes, made once and kept in `cache` (the most
        recent BUILT_SHAPES)."""
        key = _shapes(arrays)
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        made = make()
        with self._lock:
            cache[key] = made
            while len(cache) > BUILT_SHAPES:
                cache.popitem(last=False)
        return made

    def prepare(self, batch_sizes) -> float | None:
        """Build, compile and lower the graph for batches of each of `batch_sizes` rows
        now, and run it once on zeros (Triton's model warm-up), so that the first batches
        of a size wait for no compile, and the modules and compiled kernels a batch needs
        are loaded before the server freezes what it holds out of the garbage collector
        (`gateway/serve.py`; numba's compiler, loaded by a first batch after it, made each
        full collection take 35 ms). A model whose inputs vary past the batch axis is
        prepared as requests come. A graph that cannot be built for one of the sizes is
        refused (an InputError saying which size): requests of that size would fail. A
        warm-up batch that fails to run is said in the log and the model still serves:
        zeros are not a request, and a request's own failure is answered to it.

        The CPU seconds a batch of the largest size then takes, warm (the least of 3
        runs; None where none ran): what the server weighs to run the model's batches on
        its event loop."""
        if not all(s.shape and s.shape[0] == -1 and -1 not in s.shape[1:]
                   for s in self.inputs):
            return None
        took, largest = None, max(batch_sizes, default=0)
        for rows in batch_sizes:
            zeros = {s.name: np.zeros((rows,) + s.shape[1:], _dtype(s.datatype))
                     for s in self.inputs}
            try:
                executable = self._executable(zeros)
            except DeepxError as err:  # its config allows batches its graph cannot take
                raise InputError(f"cannot be built for a batch of {rows} rows, which its "
                                 f"max_batch_size allows: {err}") from None
            try:
                with np.errstate(all="ignore"):
                    executable(zeros)
                    if rows == largest:  # (this thread's CPU time, the least of 3: the
                        # server's start, its cluster's processes included, is a busy
                        # time, and a busy machine is no slower model)
                        took = min(_cpu_seconds(executable, zeros) for _ in range(3))
            except DeepxError as err:
                log.warning("model %r version %s: a warm-up batch of %d rows of zeros "
                            "failed: %s", self.name, self.version, rows, err)
        return took

    def footprint(self, arrays: dict) -> int:
        """Bytes a request run whole in one process holds at once at least: its inputs, its
        outputs and the model's weights."""
        return self._kept(self._output_bytes, arrays, lambda: _output_bytes(
            self._graph(arrays)[0])) + sum(a.nbytes for a in arrays.values()) + \
            self.weight_bytes

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
        """The checked graph for inputs of these shapes, and the weights it carries."""
        return self._kept(self._built, arrays, lambda: self._built_graph(arrays))

    def _built_graph(self, arrays: dict):
        from deepx_flow.compiler.infer import infer_types
        from deepx_flow.compiler.validate import validate_graph
        from deepx_flow.sdk.bindings import bound_inputs
        from deepx_flow.sdk.build import build_graph
        from deepx_flow.sdk.functions import input as input_
        tensors = {n: input_(n, arrays[n].shape, arrays[n].dtype) for n in arrays}
        try:
            outs, carried = self._build(tensors)
            graph = infer_types(validate_graph(build_graph(outs)))
        except DeepxError as err:
            raise InputError(f"model {self.name!r}: {err}") from None
        return graph, {**bound_inputs(outs), **carried}


def _cpu_seconds(executable, arrays: dict) -> float:
    began = time.thread_time()
    executable(arrays)
    return time.thread_time() - began


def _input_bytes(graph, names) -> int:
    """Bytes of the graph's inputs among `names` (a weight no output reads is not one)."""
    return sum(n.size * np.dtype(n.dtype).itemsize for n in graph.inputs if n.id in names)


def _output_bytes(graph) -> int:
    nodes = [graph[node_id] for _, node_id in graph.outputs]
    return sum(int(np.prod(n.shape, dtype=np.int64)) * np.dtype(n.dtype).itemsize
               for n in nodes)


def _shapes(arrays: dict) -> tuple:
    return tuple((n, arrays[n].shape) for n in sorted(arrays))


class OnnxModel(ServedModel):
    """A model from an ONNX file (`dx.onnx.load`'s checks: the checker, shape inference,
    every operator converted); its digest the file's."""

    def __init__(self, name: str, version: str, path: Path, cluster):
        import deepx_flow as dx
        self.digest = _sha256(Path(path))
        self.onnx = dx.onnx.load(path)
        types = self.onnx.input_types
        super().__init__(name, version, path, cluster, [
            TensorSpec(n, datatype_of(types[n][1]),
                       tuple(-1 if d is None else d for d in types[n][0]))
            for n in self.onnx.input_names])

    def _build(self, tensors):
        return self.onnx(**tensors), {}

    def _output_shape(self, name, built):
        declared = self.onnx.output_types.get(name)
        return tuple(-1 if d is None else d for d in (declared[0] if declared else built))


class SpecModel(ServedModel):
    """A model from a graph spec (`model.yaml`, the YAML or JSON spec of docs/graph-spec.md)
    with its weights bound: `weights.npz` beside it holds an array for each spec input it
    names (checked against the input's dtype and shape at load); the other inputs are the
    request's. A request input's first axis varies (the batch) when the spec, built again
    with another size there, still holds together; its digest covers both files."""

    platform = "deepx_flow_graph"

    def __init__(self, name: str, version: str, path: Path, cluster):
        from deepx_flow.config import settings
        from deepx_flow.spec.bounded_yaml import load as load_yaml
        from deepx_flow.spec.yaml_io import from_yaml
        path = Path(path)
        weights = path.parent / WEIGHTS_FILE
        self.digest = _sha256(path, *([weights] if weights.is_file() else []))
        check_package(path, weights)
        graph = from_yaml(path)  # read and checked as the CLI reads a spec
        self.document = load_yaml(_spec_text(path), settings().max_nodes)
        self.weights = _weights(weights, graph, cluster.task_budget()) \
            if weights.is_file() else {}
        requested = [n for n in graph.inputs if n.id not in self.weights]
        batch = all(n.shape for n in requested) and self._holds(graph, requested, 2)
        super().__init__(name, version, path, cluster, [
            TensorSpec(n.id, datatype_of(n.dtype),
                       ((-1,) + n.shape[1:]) if batch else n.shape) for n in requested])

    def _holds(self, graph, requested, size: int) -> bool:
        try:
            self._instance({n.id: (size,) + n.shape[1:] for n in requested})
            return True
        except DeepxError:
            return False

    def _instance(self, shapes: dict):
        """The spec's graph with these request inputs' shapes."""
        from deepx_flow.spec.reader import document_to_graph
        doc = copy.deepcopy(self.document)
        for name, shape in shapes.items():
            doc["inputs"][name]["shape"] = list(shape)
        return document_to_graph(doc)

    def _build(self, tensors):
        from deepx_flow.sdk.call import call
        from deepx_flow.sdk.functions import input as input_
        graph = self._instance({n: t.shape for n, t in tensors.items()})
        nodes = {n.id: n for n in graph.inputs}  # (a weight may be bound as its file)
        given = {**tensors, **{n: input_(n, nodes[n].shape, nodes[n].dtype)
                               for n in self.weights}}
        return call(graph, given), dict(self.weights)

    def _output_shape(self, name, built):
        if not self.inputs or self.inputs[0].shape[:1] != (-1,) or not built:
            return built
        return (-1,) + tuple(built[1:])  # (an output's first axis follows the batch)


WEIGHTS_FILE = "weights.npz"
PACKAGE_FILE = "package.json"


def check_package(spec: Path, weights: Path, manifest_digest: str | None = None) -> None:
    """A version written by `dx.serving.package` records the SHA-256 of its graph and of
    its parameters in package.json (and the metadata database, package.json's):
    files that no longer have them (damaged, or changed since) are refused, by name,
    with a DataError, rather than served. A graph spec written by hand has no
    package.json, and is checked only when `manifest_digest` says there was one."""
    manifest = spec.parent / PACKAGE_FILE
    if not manifest.is_file():
        if manifest_digest is None:
            return
        raise DataError(f"{manifest}: missing (the package's recorded version has one)")
    if manifest_digest is not None and _sha256(manifest) != manifest_digest:
        raise DataError(f"{manifest}: changed since the package was recorded (its SHA-256 is "
                        f"{_sha256(manifest)[:12]}..., the database records "
                        f"{manifest_digest[:12]}...)")
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DataError(f"{manifest}: cannot be read as a package's manifest: {err}") \
            from None
    if not isinstance(recorded, dict):
        raise DataError(f"{manifest}: is {shown(recorded)}, not a package's manifest")
    for field, path in (("graph_sha256", spec), ("weights_sha256", weights)):
        want = recorded.get(field)
        if not isinstance(want, str):
            raise DataError(f"{manifest}: has no {field}")
        if not path.is_file():
            raise DataError(f"{path}: missing (the package records its SHA-256)")
        got = _sha256(path)
        if got != want:
            raise DataError(f"{path}: damaged or changed since it was packaged (its SHA-256 "
                            f"is {got[:12]}..., package.json records {want[:12]}...)")


def load_model(name: str, version: str, path: Path, cluster) -> ServedModel:
    """The served model of the file at `path`: an ONNX model (`.onnx`) or a graph spec with
    bound weights (`.yaml`, `.yml`, `.json`)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".onnx":
        return OnnxModel(name, version, path, cluster)
    if suffix in (".yaml", ".yml", ".json"):
        return SpecModel(name, version, path, cluster)
    raise InputError(f"{path}: a model is an ONNX file (.onnx) or a graph spec (.yaml, "
                     f".json), not {suffix or 'a file without a suffix'}")


def _spec_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot be read: {err}") from None


def _weights(path: Path, graph, budget: int) -> dict:
    """The arrays of a weights file, each checked against the spec input it binds. When
    they are more than a task's `budget` (no replica could hold them: every request runs
    chunked on the cluster), one of STORED_CONSTANT_BYTES or more is the `.npy` file it is
    written to (`storage/weights.py`), which tasks read their region of, and this process
    keeps no copy of it; otherwise the arrays stay in memory, read once."""
    from deepx_flow.errors import ExecutionError
    from deepx_flow.storage.weights import STORED_CONSTANT_BYTES, content_digest, stored_weight
    inputs = {n.id: n for n in graph.inputs}
    try:
        data = np.load(path, allow_pickle=False)
        files = list(data.files)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not a NumPy .npz file of arrays: {err}") from None
    as_files = _input_bytes(graph, files) > budget
    out = {}
    with data:
        for name in files:  # one at a time: together they may be more than memory
            node = inputs.get(name)
            if node is None:
                raise InputError(f"{path}: array {name!r} binds no input of the spec (its "
                                 f"inputs: {', '.join(inputs)})")
            try:
                array = np.asarray(data[name])
            except (OSError, ValueError) as err:
                raise InputError(f"{path}: array {name!r} cannot be read: {err}") from None
            if (array.dtype.name, array.shape) != (node.dtype, node.shape):
                raise InputError(f"{path}: array {name!r} is {array.dtype.name}{array.shape}, "
                                 f"but the spec's input is {node.dtype}{node.shape}")
            stored = None
            if as_files and array.nbytes >= STORED_CONSTANT_BYTES:
                try:
                    stored = stored_weight(array, content_digest(array))
                except OSError as err:
                    raise ExecutionError(f"{path}: array {name!r} could not be written to "
                                         f"the asset root's weights folder: {err}") from None
            out[name] = array if stored is None else stored
    return out


def _dtype(datatype: str) -> np.dtype:
    from deepx_flow.contract.tensors import dtype_of
    return np.dtype(dtype_of(datatype, "probe"))


def _sha256(*paths: Path) -> str:
    """The SHA-256 of the files' bytes, one after another."""
    h = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as err:
            raise InputError(f"{path}: cannot be read: {err}") from None
    return h.hexdigest()
