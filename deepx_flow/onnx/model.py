"""Loading an ONNX model and turning its graph into deepx_flow tensors.

`load` reads and checks the file (ONNX's checker and strict shape inference), upgrades a
model of an opset older than 13 with `onnx.version_converter` (PyTorch, TensorFlow and
Paddle exporters wrote opsets 7 to 12 for years; the converter rewrites the operators whose
definitions changed), reads its opset, and finds every operator it uses in `converters.SUPPORTED`
before anything is built, so a model deepx_flow cannot run fails at once with the first
ONNX node it cannot take. Calling
the model walks the nodes in order (ONNX graphs are topologically sorted), converting each
with its operator's converter, on the tensors given for the graph inputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from deepx_flow.errors import GraphError, InputError, SpecError, shown
from deepx_flow.ir import dtypes
from deepx_flow.onnx.values import Context, Value, _onnx, numpy_dtype  # noqa: F401
from deepx_flow.sdk.tensor import Tensor

FIRST_OPSET = 13  # the oldest opset whose operator definitions the converters follow


class OnnxModel:
    """An imported ONNX model: call it on tensors (or arrays' named inputs) to build its
    outputs as deepx_flow tensors.

    Attributes
    ----------
    path : str
        The file it was read from.
    opset : int
        The model's opset of the default ONNX domain, as converted (13 for a model written
        at an older one, which `onnx.version_converter` upgraded).
    written_opset : int
        The opset the file was written at.
    input_names, output_names : list of str
        The graph's inputs (initializers excluded) and outputs, in order.
    input_types : dict
        name -> (shape with None for a symbolic dimension, dtype).
    output_types : dict
        The same for the outputs (None for one whose shape the file does not declare).
    inputs : dict
        The arrays of the model's initializers, by the name of the deepx_flow input each
        became. The tensors a call builds carry them already (a run binds them without
        being told); these are for a graph that lost them, a YAML spec of it, say
        (`model.inputs_for(out)`: those an output reads).
    ops : list of str
        The ONNX operator types the graph uses.
    """

    def __init__(self, proto, path: str, written_opset: int | None = None):
        self.proto, self.path = proto, path
        graph = proto.graph
        self.opset = _opset(proto, path)
        self.written_opset = written_opset or self.opset
        initialized = {t.name for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in initialized]
        self.output_names = [o.name for o in graph.output]
        self.input_types = {i.name: _value_type(i, f"{path}: graph input {shown(i.name)}")
                            for i in graph.input if i.name not in initialized}
        # (an exporter may leave an output's shape out, or its type be one that converts
        # to no deepx_flow dtype, which the node making it is refused for: None)
        self.output_types = {o.name: _declared_type(o, path) for o in graph.output}
        self.ops = sorted({n.op_type for n in graph.node})
        if len(graph.sparse_initializer):
            raise SpecError(f"{path}: sparse initializers "
                            f"({', '.join(shown(t.values.name) for t in graph.sparse_initializer)}) "
                            "are not supported")
        _check_supported(graph, self.opset, path)
        self._initializers = {t.name: _array(t, f"{path}: initializer {shown(t.name)}")
                              for t in graph.initializer}
        self.inputs: dict[str, np.ndarray] = {}
        self._build_constants()

    def _build_constants(self) -> None:
        """Bind each floating-point initializer to a named input now, so `model.inputs` is
        complete before the first call (integer ones fold into shapes and indices)."""
        ctx = Context()
        for name, array in self._initializers.items():
            if dtypes.is_float(array.dtype) and array.ndim > 0:
                ctx.tensor(Value(const=array))
        self.inputs.update(ctx.bound)

    def __call__(self, inputs: dict | None = None, **named) -> dict[str, Tensor]:
        """The model's outputs (name -> tensor) for these graph inputs (by ONNX name, as a
        dict or as keywords where the names are identifiers): tensors, or NumPy arrays for
        inputs that are constants (shapes, axes and indices must be)."""
        from deepx_flow.onnx.converters import SUPPORTED
        given = {**(inputs or {}), **named}
        unknown = sorted(set(given) - set(self.input_names))
        missing = [n for n in self.input_names if n not in given]
        if unknown or missing:
            raise InputError(f"{self.path}: " + "; ".join(
                ([f"unknown input(s) {', '.join(map(shown, unknown))}"] if unknown else []) +
                ([f"missing input(s) {', '.join(map(shown, missing))}"] if missing else []))
                + f" (the model's inputs: {', '.join(map(shown, self.input_names))})")
        ctx = Context(opsets={o.domain or "ai.onnx": o.version for o in self.proto.opset_import})
        for name, array in self._initializers.items():
            ctx.values[name] = Value(const=array)
        for name in self.input_names:
            ctx.values[name] = self._checked_input(name, given[name])
        for node in self.proto.graph.node:
            ctx.node = node
            args = [ctx.values[i] if i else None for i in node.input]
            try:
                results = SUPPORTED[op_key(node)].convert(ctx, node, args, _attributes(node))
            except GraphError as err:
                if isinstance(err, SpecError):
                    raise
                raise ctx.error(str(err)) from None
            except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as err:
                # a malformed node (a negative integer power of constants, an index past an
                # end): named, not a traceback
                raise ctx.error(f"{type(err).__name__}: {err}") from None
            for out, value in zip(node.output, results):
                if out:
                    ctx.values[out] = value
        outputs = {name: ctx.tensor(ctx.values[name]) for name in self.output_names}
        self.inputs.update(ctx.bound)
        return outputs

    def inputs_for(self, outputs) -> dict[str, np.ndarray]:
        """The arrays of `model.inputs` that `outputs` (a tensor, or a list or dict of them)
        read: `dx.run` refuses inputs its graph does not have, and an output may not need
        every weight of the model."""
        from deepx_flow.sdk.build import build_graph
        read = {n.id for n in build_graph(outputs).nodes if n.op == "input"}
        return {name: array for name, array in self.inputs.items() if name in read}

    def _checked_input(self, name: str, value) -> Value:
        """A graph input as given: a tensor, or a NumPy array, which is a constant of the
        graph (an input holding shapes, axes or indices must be one)."""
        if isinstance(value, Tensor):
            given = Value(tensor=value)
        elif isinstance(value, np.ndarray):
            given = Value(const=value)
        else:
            raise InputError(f"{self.path}: input {shown(name)} must be a deepx_flow tensor "
                             f"(dx.input, dx.read_zarr, ...) or a NumPy array (a constant), "
                             f"got {type(value).__name__}")
        shape, dtype = self.input_types[name]
        fits = len(shape) == len(given.shape) and all(
            s is None or s == t for s, t in zip(shape, given.shape))
        if not fits or dtype != given.dtype:
            want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
            raise InputError(f"{self.path}: input {shown(name)} is {dtype}{want} in the model, "
                             f"got {given.dtype}{tuple(given.shape)}")
        return given

    def __repr__(self) -> str:
        opset = f"opset {self.opset}" + (f" (written at {self.written_opset})"
                                          if self.written_opset != self.opset else "")
        return (f"OnnxModel({self.path!r}, {opset}, inputs {self.input_names}, "
                f"outputs {self.output_names}, {len(self.proto.graph.node)} nodes)")


def load(path) -> OnnxModel:
    """Read the ONNX model at `path`, check it and infer its shapes.

    Raises
    ------
    InputError
        The file is not there or cannot be read.
    SpecError
        The file is not a valid ONNX model, its opset is newer than the `onnx` package
        knows or older than 13 and cannot be upgraded to 13 by `onnx.version_converter`,
        or it uses an operator, attribute or data type deepx_flow does not convert (the
        error names the first such ONNX node).
    """
    onnx = _onnx()
    path = str(path)
    if not Path(path).is_file():
        raise InputError(f"ONNX model {path} does not exist")
    try:
        proto = onnx.load(path)
    except Exception as err:  # protobuf's DecodeError and friends
        raise SpecError(f"{path}: not an ONNX model: {type(err).__name__}: {err}") from None
    try:
        onnx.checker.check_model(proto)
    except Exception as err:  # onnx's ValidationError
        raise SpecError(f"{path}: the model does not pass ONNX's checks: "
                        f"{_one_line(err)}") from None
    written = _default_opset(proto)
    proto = _upgraded(proto, path)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    except Exception as err:  # onnx's InferenceError
        if not any(n.domain == "ai.onnx.ml" for n in proto.graph.node):
            raise SpecError(f"{path}: the model does not pass ONNX's checks: "
                            f"{_one_line(err)}") from None
        # ONNX infers no types for some ai.onnx.ml operators (a Normalizer's output): the
        # converters work out every shape and type themselves
        proto = onnx.shape_inference.infer_shapes(proto)
    from deepx_flow.onnx.fold import fold_batch_norms
    return OnnxModel(fold_batch_norms(proto), path, written_opset=written)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:400]


def _default_opset(proto) -> int | None:
    return {o.domain or "ai.onnx": o.version for o in proto.opset_import}.get("ai.onnx")


def _upgraded(proto, path: str):
    """`proto` itself, or, for an opset older than FIRST_OPSET, the model
    `onnx.version_converter` upgrades to it; what it cannot upgrade is one SpecError with
    the converter's reason (which names the operator)."""
    onnx = _onnx()
    opset = _default_opset(proto)
    if opset is None or opset >= FIRST_OPSET:
        return proto
    from onnx import version_converter
    try:
        upgraded = version_converter.convert_version(proto, FIRST_OPSET)
        # IR versions before 4 list every initializer among the graph inputs; the
        # converter adds initializers without, so the upgraded model takes the IR version
        # its opsets need
        upgraded.ir_version = max(upgraded.ir_version, onnx.helper.find_min_ir_version_for(
            list(upgraded.opset_import), ignore_unknown=True))
        onnx.checker.check_model(upgraded)
    except Exception as err:  # the converter's RuntimeError, the checker's ValidationError
        gone = _without_a_form(proto, FIRST_OPSET)
        reason = (f"operator(s) {', '.join(gone)} have no form at opset {FIRST_OPSET} "
                  "(experimental or removed)" if gone else _one_line(err))
        raise SpecError(f"{path}: opset {opset} cannot be upgraded to {FIRST_OPSET} with "
                        f"onnx.version_converter: {reason}") from None
    return upgraded


def _without_a_form(proto, opset: int) -> list[str]:
    """The default-domain operators of `proto` that opset `opset` does not define, or
    defines as deprecated: what the converter has no upgrade for."""
    onnx = _onnx()
    gone = []
    for op in sorted({n.op_type for n in proto.graph.node if n.domain in ("", "ai.onnx")}):
        try:
            if onnx.defs.get_schema(op, opset, "").deprecated:
                gone.append(op)
        except onnx.defs.SchemaError:
            gone.append(op)
    return gone


def _opset(proto, path: str) -> int:
    onnx = _onnx()
    versions = {o.domain or "ai.onnx": o.version for o in proto.opset_import}
    opset = versions.get("ai.onnx")
    newest = onnx.defs.onnx_opset_version()
    if opset is None:
        if any(n.domain in ("", "ai.onnx") for n in proto.graph.node):
            raise SpecError(f"{path}: the model imports no opset of the default ONNX domain")
        return FIRST_OPSET  # only scikit-learn's operators (ai.onnx.ml): none of ONNX's
    if opset > newest:
        raise SpecError(f"{path}: opset {opset} is not supported (the newest the installed "
                        f"onnx package knows is {newest}); upgrade the onnx package")
    return opset


# The domains whose operators convert: ONNX's own, and scikit-learn's (`ml_ops.py`), whose
# operators `SUPPORTED` names with the domain in front.
DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def op_key(node) -> str:
    """A node's operator as `SUPPORTED` names it: `Relu`, `ai.onnx.ml.Scaler`."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _check_supported(graph, opset: int, path: str) -> None:
    from deepx_flow.onnx.converters import REFUSED, SUPPORTED
    for node in graph.node:
        where = f"{path}: ONNX node {shown(node.name or node.output[0])} ({node.op_type})"
        if node.domain not in DOMAINS:
            raise SpecError(f"{where}: operators of domain {shown(node.domain)} are not "
                            "supported")
        if op_key(node) in REFUSED:
            raise SpecError(f"{where}: {REFUSED[op_key(node)]}")
        op = SUPPORTED.get(op_key(node))
        if op is None:
            raise SpecError(f"{where}: operator {op_key(node)} is not supported; "
                            f"`deepx-flow onnx ops` lists those that are")
        for attr in node.attribute:
            if attr.name not in op.attrs:
                raise SpecError(f"{where}: attribute {shown(attr.name)} is not supported "
                                f"(supported: {', '.join(op.attrs) or 'none'})")
            if attr.type == attr.GRAPH or attr.type == attr.GRAPHS:
                raise SpecError(f"{where}: subgraphs are not supported")


def _declared_type(info, path: str) -> tuple[tuple, str] | None:
    """A graph output's declared (shape, dtype), or None where the file does not say or
    says a type deepx_flow has no dtype for."""
    if not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
        return None
    try:
        return _value_type(info, f"{path}: graph output {shown(info.name)}")
    except SpecError:
        return None


def _value_type(info, where: str) -> tuple[tuple, str]:
    t = info.type
    if not t.HasField("tensor_type"):
        raise SpecError(f"{where}: only tensors are supported (not sequences, maps or "
                        "optionals)")
    dtype = numpy_dtype(t.tensor_type.elem_type, where).name
    if not t.tensor_type.HasField("shape"):
        raise SpecError(f"{where}: the model declares no shape (not even a rank) for it")
    # A dimension stored as a negative value (some exporters write -1) is symbolic, as
    # ONNX Runtime takes it.
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None
                 for d in t.tensor_type.shape.dim)
    return dims, dtype


def _array(tensor, where: str) -> np.ndarray:
    onnx = _onnx()
    numpy_dtype(tensor.data_type, where)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise SpecError(f"{where}: external data is not loaded: onnx.load the model with its "
                        "data beside it")
    return onnx.numpy_helper.to_array(tensor)


def _attributes(node) -> dict:
    onnx = _onnx()
    out = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if attr.type == attr.TENSOR:
            value = onnx.numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode()
        out[attr.name] = value
    return out


def identifier(name: str) -> str:
    """An ONNX value name as a deepx_flow input name (an identifier)."""
    text = re.sub(r"\W", "_", name)
    return text if text.isidentifier() else f"v_{text}"
