"""deepx_flow graphs written as ONNX models (`dx.onnx.save`), the way back of `dx.onnx.load`.

    x = dx.input("x", (64, 784), "float32")           # unbound: a graph input of the model
    w = dx.input("w", (784, 10), "float32")           # bound below: an initializer
    probs = dx.softmax(x @ w, axis=1)
    dx.onnx.save({"probs": probs}, "mlp.onnx", inputs={"w": w_trained},
                 dynamic_axes={"x": {0: "N"}})         # x's axis 0 any size at run time

What is written is the graph as it was built (the tensors, a `Graph` from `dx.build_graph`
or a YAML spec), before compilation: the compiler's `fused` nodes, epilogues and prologues
have no ONNX form, and a compiled graph is refused. Each node becomes one ONNX node or a few
(`export_ops`); its value is named by the node's id, an output by its name (as `dx.run`
names them). `dx.input`s bound in `inputs` become initializers under their names; the
others become graph inputs with their shape and dtype. A random source (`dx.random.normal`
weights) becomes an initializer holding its values: they depend only on (seed, element
index), which ONNX's RandomNormal cannot reproduce, so the model holds what deepx_flow computes.

Dynamic axes: an axis of a graph input named in `dynamic_axes` is written as a symbolic
dimension, and every value computed from it carries the symbol (`symbolic_dims`). The graph
itself was built for one size, so the nodes that would fix it are refused by name: a reshape
that moves the axis, a slice or concatenation along it, an operand of a fixed size broadcast
against it. The batch axis of an MLP or a conv net passes all of these.

The model is checked by `onnx.checker.check_model(full_check=True)` (strict shape
inference included) before anything is written; it is written to a temporary file in the
target's folder and renamed over the target, so a failed export leaves no file and a reader
never sees half a model. Every refusal is one `dx.SpecError` naming the node and its op (an
input that does not fit is a `dx.InputError`). Needs the `onnx` package (the `onnx` extra).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np

from deepx_flow.errors import InputError, SpecError, shown
from deepx_flow.ir import Graph, Node
from deepx_flow.onnx.export_bfloat16 import widen_bfloat16
from deepx_flow.onnx.export_ops import EXPORTERS, MAX_MODEL_BYTES, REFUSED, Arg, squeezed_axes
from deepx_flow.onnx.model import FIRST_OPSET, _onnx

DEFAULT_OPSET = 18
# Attributes only the compiler writes (a fused program, a matmul's epilogue, a reduction's
# prologue): a graph holding one was compiled.
COMPILED_ATTRS = ("program", "prologue", "epilogue")


def save(outputs, path, inputs: dict | None = None, opset: int | None = None,
         dynamic_axes: dict | None = None) -> str:
    """Write the graph of `outputs` to `path` as an ONNX model.

    Parameters
    ----------
    outputs : Tensor, list or dict of Tensors, or Graph
        What the model computes, named as `dx.run` names them: a dict's keys, else each
        tensor's name, else `out0`, `out1`, ...
    path : str or path-like
        The `.onnx` file to write (replaced if it exists); its folder must exist.
    inputs : dict, optional
        Input name -> NumPy array, for the `dx.input`s that are weights: each becomes an
        initializer of the model, as does every NumPy array the tensors carry (an imported
        model's weights, `dx.constant`s). The other inputs become the model's graph inputs.
    opset : int, optional
        The opset of the default ONNX domain, from 13 to the newest the installed `onnx`
        package knows; default 18.
    dynamic_axes : dict, optional
        Graph input name -> {axis: symbol}, e.g. `{"x": {0: "N"}}`: those axes take any size
        when the model runs. Inputs that share a symbol must have equal sizes there.

    Returns
    -------
    str
        The path written.

    Raises
    ------
    SpecError
        An operator with no ONNX form (`read_zarr`, a compiled `fused` node), a node
        that would fix a dynamic axis, an opset outside the range, or a model ONNX's checker
        refuses; the message names the node and its op. Nothing is written.
    InputError
        `inputs` or `dynamic_axes` name inputs the graph does not have, or give an array of
        another shape or dtype; the target's folder does not exist.
    """
    target = Path(path)
    folder = target.absolute().parent
    if not folder.is_dir():
        raise InputError(f"cannot write {target}: folder {folder} does not exist")
    model = to_model(outputs, inputs=inputs, opset=opset, dynamic_axes=dynamic_axes)
    data = model.SerializeToString()
    # A new file under a unique name ("x": never one that exists), with the mode the user's
    # umask gives (mkstemp's would be 0600), renamed over the target once whole.
    temp = folder / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return str(target)


def to_model(outputs, inputs: dict | None = None, opset: int | None = None,
             dynamic_axes: dict | None = None):
    """The checked `onnx.ModelProto` that `save` writes (same parameters, no path)."""
    from deepx_flow import __version__
    from deepx_flow.sdk.build import build_graph
    onnx = _onnx()
    helper = onnx.helper
    opset = _checked_opset(opset)
    graph = build_graph(outputs)
    _refuse_compiled(graph)
    graph = widen_bfloat16(graph)  # computed in float32, as deepx_flow computes it
    bound = _bound_inputs(graph, {**_carried_arrays(outputs), **(inputs or {})})
    dims = symbolic_dims(graph, _checked_dynamic(graph, dynamic_axes, bound))
    b = Builder(opset, dims, reserved={n.id for n in graph.inputs} | {n for n, _ in graph.outputs})
    graph_inputs, initializers = [], []
    for node in graph.inputs:
        if node.id in bound:
            initializers.append(onnx.numpy_helper.from_array(bound[node.id], node.id))
        else:
            graph_inputs.append(_value_info(helper, node.id, node, dims[node.id]))
    names = _output_value_names(graph)
    values: dict[str, str] = {n.id: n.id for n in graph.inputs}
    for node in graph.nodes:
        if node.op == "input":
            continue
        exporter = EXPORTERS.get(node.op)
        if exporter is None:
            reason = REFUSED.get(node.op, "ONNX has no operator for it here")
            raise SpecError(f"{node.op} cannot be exported to ONNX: {reason}", node.id)
        args = [Arg(values[i], graph[i].shape, graph[i].dtype, dims[i]) for i in node.inputs]
        out = names.get(node.id) or b.fresh(node.id)
        b.begin(node.id)
        exporter(b, node, args, out)
        values[node.id] = out
    outputs_info = []
    for name, node_id in graph.outputs:
        if values[node_id] != name:
            b.add("Identity", [values[node_id]], out=name)
        outputs_info.append(_value_info(helper, name, graph[node_id], dims[node_id]))
    proto = helper.make_graph(b.nodes, "deepx_flow", graph_inputs, outputs_info,
                              initializers + b.initializers)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(proto, opset_imports=opsets, producer_name="deepx_flow",
                              producer_version=__version__, ir_version=_ir_version(opsets))
    size = model.ByteSize()
    if size > MAX_MODEL_BYTES:
        raise SpecError(f"the model would be {size / 2**30:.1f} GiB, past protobuf's 2 GiB "
                        "limit for one file (external data is not written)")
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as err:  # onnx's ValidationError, InferenceError
        message = " ".join(str(err).split())
        raise SpecError(f"the exported model does not pass ONNX's checks (a fault of the "
                        f"exporter; please report it): {message[:400]}") from None
    return model


class Builder:
    """The ONNX graph being written: its nodes, the initializers of its constants, and the
    value names taken. `dims` maps a node id to its symbolic dimensions."""

    def __init__(self, opset: int, dims: dict[str, tuple], reserved: set[str]):
        self.opset, self.dims = opset, dims
        self.nodes: list = []
        self.initializers: list = []
        self._mark, self._prefix = 0, ""
        self._taken = set(reserved)
        self._helper = _onnx().helper

    def begin(self, node_id: str) -> None:
        """The nodes appended from now on compute the node `node_id`; their values are named
        after it (`relu-3f2a9c81b0de/Cast`)."""
        self._mark, self._prefix = len(self.nodes), node_id

    def fresh(self, hint: str) -> str:
        """A value name not taken yet: `hint`, else `hint_1`, `hint_2`, ..."""
        name, k = hint, 0
        while name in self._taken:
            k += 1
            name = f"{hint}_{k}"
        self._taken.add(name)
        return name

    def add(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        """Append one ONNX node; its output is `out`, or a new name. Returns the output."""
        out = out or self.fresh(f"{self._prefix}/{op_type}")
        self.nodes.append(self._helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(self, array: np.ndarray, hint: str) -> str:
        """An initializer holding `array`; returns its name."""
        from onnx import numpy_helper
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def initializer(self, array: np.ndarray, name: str) -> str:
        """An initializer holding `array` under `name`, a value name this node was given."""
        from onnx import numpy_helper
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def tensor(self, array: np.ndarray):
        """`array` as a TensorProto attribute value."""
        from onnx import numpy_helper
        return numpy_helper.from_array(np.asarray(array))

    def cast(self, value: str, src: str, dst: str, out: str | None = None,
             always: bool = False) -> str:
        """`value` (of type `src`) as `dst`, in `out` when given. Where the types agree it is
        `value` itself; or, to land in `out` (or when `always`), the last node's output
        renamed when this node's exporter made it, else an Identity."""
        if src != dst:
            return self.add("Cast", [value], out=out, to=onnx_type(dst))
        if out is None and not always:
            return value
        last = self.nodes[-1] if len(self.nodes) > self._mark else None
        if out is not None and last is not None and list(last.output) == [value]:
            last.output[0] = last.name = out  # nothing reads it yet: it was made just now
            return out
        return self.add("Identity", [value], out=out)


def _ir_version(opsets) -> int:
    """The oldest IR version that holds `opsets`, so that older runtimes read the model;
    the package's own for an opset newer than its version table (onnx 1.22's lacks 27)."""
    onnx = _onnx()
    try:
        return onnx.helper.find_min_ir_version_for(opsets)
    except ValueError:
        return onnx.IR_VERSION


def onnx_type(dtype: str) -> int:
    return _onnx().helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _value_info(helper, name: str, node: Node, dims: tuple):
    shape = [d if d is not None else s for s, d in zip(node.shape, dims)]
    return helper.make_tensor_value_info(name, onnx_type(node.dtype), shape)


# -- checks of what is asked ---------------------------------------------------------------
def _checked_opset(opset) -> int:
    newest = _onnx().defs.onnx_opset_version()
    if opset is None:
        return min(DEFAULT_OPSET, newest)
    if not isinstance(opset, int) or isinstance(opset, bool) or not FIRST_OPSET <= opset <= newest:
        raise SpecError(f"opset {shown(opset)} is not supported: from {FIRST_OPSET} to {newest}, "
                        "the newest the installed onnx package knows")
    return opset


def _refuse_compiled(graph: Graph) -> None:
    for node in graph.nodes:
        if node.op == "fused" or any(node.attr(a) is not None for a in COMPILED_ATTRS):
            raise SpecError(f"{node.op} cannot be exported to ONNX: the graph was compiled "
                            "(this node holds a fused program); export the graph as built (the "
                            "tensors, or dx.build_graph of them)", node.id)


def _carried_arrays(outputs) -> dict[str, np.ndarray]:
    """The NumPy arrays the tensors behind `outputs` carry (an imported model's weights,
    `dx.constant`s): initializers without being named (a dask array stays an input)."""
    from deepx_flow.sdk.bindings import bound_inputs, carried_array
    return {name: carried_array(b) for name, b in bound_inputs(outputs).items()
            if isinstance(b.value, (np.ndarray, str))}


def _bound_inputs(graph: Graph, inputs: dict | None) -> dict[str, np.ndarray]:
    """The arrays of the bound inputs, each checked against its `dx.input`."""
    declared = {n.id: n for n in graph.inputs}
    unknown = sorted(set(inputs or {}) - set(declared))
    if unknown:
        raise InputError(f"unknown input(s) {', '.join(map(shown, unknown))}; the graph's "
                         f"inputs are {', '.join(map(shown, declared)) or 'none'}")
    bound = {}
    for name, value in (inputs or {}).items():
        node = declared[name]
        if not isinstance(value, (np.ndarray, np.generic)):
            raise InputError(f"input {shown(name)} must be a NumPy array to become an "
                             f"initializer, got {type(value).__name__}")
        array = np.asarray(value)
        if array.shape != node.shape:
            raise InputError(f"input {shown(name)} must have shape {node.shape}, but the array "
                             f"given has shape {array.shape}")
        if array.dtype.name != node.dtype:
            raise InputError(f"input {shown(name)} must have dtype {node.dtype}, but the array "
                             f"given has dtype {array.dtype.name}; convert it first "
                             f"(array.astype('{node.dtype}'))")
        bound[name] = array
    return bound


def _checked_dynamic(graph: Graph, dynamic_axes, bound) -> dict[str, dict[int, str]]:
    """`dynamic_axes` with its axes made non-negative, each naming an axis of a graph input
    (not of an initializer: weights have the sizes they have)."""
    if dynamic_axes is None:
        return {}
    if not isinstance(dynamic_axes, dict):
        raise InputError(f"dynamic_axes must be a dict of input name -> {{axis: symbol}}, got "
                         f"{shown(dynamic_axes)}")
    declared = {n.id: n for n in graph.inputs}
    out = {}
    for name, axes in dynamic_axes.items():
        if name not in declared or name in bound:
            what = "is bound in inputs (an initializer has fixed sizes)" if name in bound \
                else "is not an input of the graph"
            raise InputError(f"dynamic_axes: {shown(name)} {what}; the graph inputs are "
                             f"{', '.join(shown(n) for n in declared if n not in bound) or 'none'}")
        node = declared[name]
        if not isinstance(axes, dict):
            raise InputError(f"dynamic_axes[{shown(name)}] must be a dict of axis -> symbol "
                             f"name, e.g. {{0: 'N'}}, got {shown(axes)}")
        out[name] = {}
        for axis, symbol in axes.items():
            if not isinstance(axis, int) or isinstance(axis, bool) or \
                    not -node.ndim <= axis < node.ndim:
                raise InputError(f"dynamic_axes[{shown(name)}]: {shown(axis)} is not an axis of "
                                 f"the {node.ndim}-D input")
            if not isinstance(symbol, str) or not symbol:
                raise InputError(f"dynamic_axes[{shown(name)}][{axis}]: the symbol must be a "
                                 f"non-empty string, got {shown(symbol)}")
            out[name][axis % node.ndim] = symbol
    return out


def _output_value_names(graph: Graph) -> dict[str, str]:
    """node id -> the output name its value takes directly (the first output naming a
    computed node); the other outputs are Identity nodes of their values. An output may not
    take the name of another node's input: ONNX values have one name each."""
    inputs = {n.id for n in graph.inputs}
    names: dict[str, str] = {}
    for name, node_id in graph.outputs:
        if name in inputs and name != node_id:
            raise SpecError(f"output {shown(name)} has the name of an input of the graph; "
                            "ONNX values have one name each: name the output otherwise",
                            node_id)
        if node_id not in inputs and node_id not in names:
            names[node_id] = name
    return names


# -- dynamic axes --------------------------------------------------------------------------
def symbolic_dims(graph: Graph, dynamic: dict[str, dict[int, str]]) -> dict[str, tuple]:
    """node id -> per axis, the symbol of a dynamic dimension or None, propagated from the
    graph inputs named in `dynamic` (input name -> {axis: symbol}).

    Before: a graph of fixed shapes. After: each node's axes that follow a dynamic input
    axis carry its symbol. A node that would fix a dynamic axis (its output, or the shape
    it writes, depends on that axis's size) is a SpecError naming it.
    """
    dims: dict[str, tuple] = {}
    for node in graph.nodes:
        if node.op == "input":
            given = dynamic.get(node.id, {})
            dims[node.id] = tuple(given.get(a) for a in range(node.ndim))
            continue
        ins = [(graph[i], dims[i]) for i in node.inputs]
        if not any(s is not None for _, d in ins for s in d):
            dims[node.id] = (None,) * node.ndim
            continue
        if node.op not in EXPORTERS:  # refused by name when it is exported
            dims[node.id] = (None,) * node.ndim
            continue
        try:
            dims[node.id] = _DIM_RULES.get(node.op, _dims_elementwise)(node, ins)
        except SpecError as err:
            raise SpecError(f"{err}; it lies {_between(graph, node, ins, dynamic)}") from None
    return dims


def _between(graph: Graph, node, ins, dynamic) -> str:
    """Where a refused node is, in the names the user gave: the graph input whose dynamic
    axis reaches it and an output it leads to (its own id is often generated, made inside a
    composite such as `dx.nn.conv_transpose`)."""
    symbols = {s for _, d in ins for s in d if s is not None}
    source = next((f"{shown(name)} (axis {axis}, {symbol})"
                   for name, axes in dynamic.items() for axis, symbol in axes.items()
                   if symbol in symbols), "?")
    users, outputs = graph.consumers(), {node_id: name for name, node_id in graph.outputs}
    seen, frontier = {node.id}, [node.id]
    while frontier and not any(n in outputs for n in frontier):
        frontier = [u for n in frontier for u in users.get(n, ()) if u not in seen]
        seen.update(frontier)
    target = next((outputs[n] for n in frontier if n in outputs), None)
    return f"between graph input {source} and output {shown(target or '?')}"


def _fixed(node: Node, message: str) -> SpecError:
    return SpecError(f"{node.op} fixes a dynamic axis: {message}; export without "
                     "dynamic_axes, or build the graph so that the axis only passes through",
                     node.id)


def _broadcast_dims(node: Node, operands, ndim: int) -> list:
    """Dims of NumPy broadcasting of `operands` ((id, shape, dims) each): on each axis, the
    operands' symbol if any has one; every operand without it must be of size 1 there."""
    out = []
    for axis in range(ndim):
        symbols, fixed = set(), []
        for name, shape, d in operands:
            i = axis - (ndim - len(shape))
            if i < 0:
                continue
            if d[i] is not None:
                symbols.add(d[i])
            elif shape[i] != 1:
                fixed.append((name, shape[i]))
        if len(symbols) > 1:
            raise _fixed(node, f"axis {axis} joins dynamic axes {', '.join(sorted(symbols))}")
        if symbols and fixed:
            raise _fixed(node, f"operand {shown(fixed[0][0])} has a fixed size {fixed[0][1]} on "
                               f"axis {axis}, which is dynamic ({symbols.pop()}) in another "
                               "operand")
        out.append(symbols.pop() if symbols else None)
    return out


def _dims_elementwise(node, ins):
    return tuple(_broadcast_dims(node, [(x.id, x.shape, d) for x, d in ins], node.ndim))


def _dims_matmul(node, ins):
    (a, da), (b, db) = ins
    if da[-1] != db[-2]:
        raise _fixed(node, "the contracted axis is dynamic in one operand only (or two "
                           "symbols meet there)")
    batch = _broadcast_dims(node, [(a.id, a.shape[:-2], da[:-2]), (b.id, b.shape[:-2], db[:-2])],
                            node.ndim - 2)
    return tuple(batch) + (da[-2], db[-1])


def _dims_reduce(node, ins):
    ((_, d),) = ins
    axes, keep = node.attr("axes"), node.attr("keepdims", False)
    return tuple(None if i in axes else s for i, s in enumerate(d) if keep or i not in axes)


def _dims_same(node, ins):
    return ins[0][1]


def _dims_transpose(node, ins):
    ((_, d),) = ins
    return tuple(d[i] for i in node.attr("axes"))


def _dims_reshape(node, ins):
    """Dynamic axes pass a reshape where the shapes agree up to them (written as 0, "copy":
    flattening the image axes of (N, C, H, W) into (N, C*H*W)), or where it only drops or
    adds axes of size 1 (`squeezed_axes`: a Squeeze or Unsqueeze an exporter wrote, which
    the exporter writes back as such)."""
    ((x, d),) = ins
    prefix = 0
    while prefix < min(x.ndim, node.ndim) and x.shape[prefix] == node.shape[prefix]:
        prefix += 1
    moved = [i for i, s in enumerate(d) if s is not None and i >= prefix]
    if not moved:
        return tuple(d[i] if i < prefix else None for i in range(node.ndim))
    pairs = squeezed_axes(x.shape, d, node.shape)
    if pairs is None:
        raise _fixed(node, f"it moves dynamic axis {moved[0]} ({d[moved[0]]}) of {x.shape} "
                           f"into {node.shape}")
    out = [None] * node.ndim
    for i, o in pairs:
        out[o] = d[i]
    return tuple(out)


def _dims_concat(node, ins):
    axis = node.attr("axis")
    out = []
    for a in range(node.ndim):
        symbols = {d[a] for _, d in ins}
        if a == axis and symbols != {None}:
            raise _fixed(node, f"it joins tensors along dynamic axis {axis}")
        if len(symbols) > 1:
            dynamic = next((x, d[a]) for x, d in ins if d[a] is not None)
            fixed = next(((x, d[a]) for x, d in ins if d[a] != dynamic[1]))
            size = f"a fixed size {fixed[0].shape[a]}" if fixed[1] is None \
                else f"dynamic size {fixed[1]}"
            raise _fixed(node, f"operand {shown(fixed[0].id)} has {size} on axis {a}, which is "
                               f"dynamic ({dynamic[1]}) in operand {shown(dynamic[0].id)}")
        out.append(symbols.pop())
    return tuple(out)


def _dims_slice(node, ins):
    ((x, d),) = ins
    for axis, (lo, hi, step) in enumerate(zip(node.attr("starts"), node.attr("stops"),
                                              node.attr("steps"))):
        if d[axis] is not None and (lo, hi, step) != (0, x.shape[axis], 1):
            raise _fixed(node, f"it slices dynamic axis {axis} ({d[axis]}) as {lo}:{hi}:{step}")
    return d


def _dims_take(node, ins):
    (x, d), (_, di) = ins
    axis = node.attr("axis")
    return d[:axis] + di + d[axis + 1:]


def _dims_window(node, ins):
    (x, d) = ins[0]
    if any(s is not None for s in d[1:]) or any(s is not None for _, w in ins[1:] for s in w):
        raise _fixed(node, "only the batch axis (0) of a convolution or pooling may be dynamic")
    return (d[0],) + (None,) * (node.ndim - 1)


def _dims_indexed(node, ins):
    """Scatters and element gathers tie their operands' extents together (indices at most
    as long as x, updates as long as the indices): fixed shapes only."""
    if any(s is not None for _, d in ins for s in d):
        raise _fixed(node, "scatters and element gathers take fixed shapes")
    return (None,) * node.ndim


_DIM_RULES = {"matmul": _dims_matmul, "sum": _dims_reduce, "mean": _dims_reduce,
              "prod": _dims_reduce, "max": _dims_reduce, "min": _dims_reduce,
              "softmax": _dims_same, "log_softmax": _dims_same, "cumsum": _dims_same,
              "transpose": _dims_transpose, "reshape": _dims_reshape, "concat": _dims_concat,
              "slice": _dims_slice, "flip": _dims_same, "take": _dims_take,
              "conv": _dims_window, "max_pool": _dims_window, "avg_pool": _dims_window, "scatter_elements": _dims_indexed,
              "gather_elements": _dims_indexed, "scatter_nd": _dims_indexed,
              "gather_nd": _dims_indexed}
