"""How each deepx_flow operator is written as ONNX nodes: the exporters `dx.onnx.save` uses.

`EXPORTERS` maps a deepx_flow operator to a function `(b, node, args, out)` that appends the
ONNX nodes computing `node` to the builder `b` (`export.Builder`), reading its operands'
ONNX values `args` (an `Arg` each: value name, shape, dtype, symbolic dimensions) and writing
its result to the value named `out`. `REFUSED` says why the operators that have no ONNX form
are not exported; an operator in neither table (one a third-party engine registered) is
refused as well.

deepx_flow's types follow NumPy (`int32 + float32` is float64, `exp` of an int is a float,
the sum of int32 is int64, `bool + bool` is a logical or); ONNX's operators take operands of
one type and a list of types each. The exporters make NumPy's rule explicit: operands are
cast to the type the node computes in, and where ONNX (or ONNX Runtime's CPU kernels, which
lack a few of ONNX's types) has no kernel for that type the computation runs in a wider one
that gives the same values (small integers in int64, whose results wrap the same way, bools
as uint8) and is cast back. Semantics kept from the kernels (`kernels/elementwise.py`): gelu
is the tanh approximation in the kernels' order, float16 sigmoid, gelu, erf, reciprocal and
softplus are computed in float32 and rounded once, arange is `start + step * index` computed
in int64 or float64. Float sums and means add up in the tensor's dtype in ONNX (float16 in
float32), where deepx_flow adds in float64: the results agree to the dtype's rounding, not
bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from deepx_flow.errors import SpecError
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node

# protobuf's limit on one message; larger models need external data, not written here
MAX_MODEL_BYTES = 2**31 - 1


@dataclass(frozen=True)
class Arg:
    """An operand as the exporters see it: its ONNX value and what the IR knows of it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dims: tuple  # per axis: the symbolic dimension's name, or None for a fixed size


Exporter = Callable[..., None]  # (b, node, args, out) -> None
EXPORTERS: dict[str, Exporter] = {}

REFUSED = {
    "read_zarr": "a stored array is read by the engine, not by the model: use dx.input in its "
                 "place (a graph input of the model), or bind its data as an initializer",
    "fused": "it is made by the compiler: export the graph as built (the tensors, or "
             "dx.build_graph of them), not a compiled one",
}


def _exporter(*ops: str):
    def register(fn):
        for op in ops:
            EXPORTERS[op] = fn
        return fn
    return register


def _refuse(node: Node, message: str) -> SpecError:
    return SpecError(f"{node.op} has no ONNX export here: {message}", node.id)


# -- types ---------------------------------------------------------------------------------
def _unsigned(dtype: str) -> bool:
    return np.dtype(dtype).kind == "u"


def _widened(dtype: str, supported: tuple[str, ...]) -> str:
    """A type ONNX computes `dtype`'s values in: itself where supported, bools as uint8,
    other integers as int64 (uint64 stays bit for bit: the same ring modulo 2**64)."""
    if dtype in supported:
        return dtype
    if dtype == "bool" and "uint8" in supported:
        return "uint8"
    if np.dtype(dtype).kind in "biu" and "int64" in supported:
        return "int64"
    return "float64"


# The types each operator is computed in where ONNX Runtime's CPU kernels take fewer than
# every numeric type (they lack some that ONNX's own lists have: uint sums, int16 Where and
# Max). Widening into them is exact: int64 holds the smaller integers, and uint64 sums wrap
# modulo 2**64 in int64 exactly as they do in uint64.
POW_TYPES = ("int32", "int64", "float16", "float32", "float64")
MATMUL_TYPES = ("int32", "int64", "uint32", "uint64", "float16", "float32", "float64")
SUM_TYPES = ("int32", "int64", "float16", "float32", "float64")
EXTREME_TYPES = ("int8", "uint8", "int32", "int64", "uint64", "float16", "float32", "float64")
MINMAX_TYPES = EXTREME_TYPES + ("uint32",)
WHERE_TYPES = ("int8", "uint8", "int32", "uint32", "int64", "float16", "float32", "float64")
MAX_POOL_TYPES = ("float16", "float32", "float64", "int8", "uint8")


def _compute(b, x: Arg, dtype: str, supported: tuple[str, ...]) -> tuple[str, str]:
    """`x` cast to the type its values are computed in (see `_widened`): (value, type)."""
    work = _widened(dtype, supported)
    return b.cast(x.name, x.dtype, work), work


# -- sources -------------------------------------------------------------------------------
@_exporter("full")
def _full(b, node, args, out):
    value = np.array(node.attr("value"), dtype=node.dtype)
    if node.size <= 1:
        b.add("Constant", [], out=out, value=b.tensor(np.full(node.shape, value)))
        return
    shape = b.const(np.array(node.shape, dtype=np.int64), f"{node.id}/shape")
    b.add("ConstantOfShape", [shape], out=out, value=b.tensor(value.reshape(1)))


@_exporter("random_normal", "random_uniform")
def _random(b, node, args, out):
    """An initializer holding the tensor's values, computed here by the kernel the workers
    run. ONNX's RandomNormal and RandomUniform draw other values on every run, from a
    generator of their own; deepx_flow's depend only on (seed, element index), so the
    values are what the model must hold to compute what deepx_flow computes."""
    from deepx_flow.kernels.random import random_chunk
    from deepx_flow.ops.sources import RANDOM_PARAMS
    nbytes = node.size * dtypes.itemsize(node.dtype)
    if nbytes > MAX_MODEL_BYTES:  # refused before the values are computed
        raise _refuse(node, f"its values would be an initializer of {nbytes / 2**30:.1f} GiB, "
                            "past protobuf's 2 GiB limit for one file")
    params = {k: node.attr(k, default) for k, default in RANDOM_PARAMS[node.op].items()}
    values = random_chunk(node.op, node.attr("seed"), params, node.shape,
                          [(0, n) for n in node.shape], node.dtype)
    b.initializer(np.array(values), out)


@_exporter("arange")
def _arange(b, node, args, out):
    """`start + step * index`, in float64 when start or step is a float (else int64), cast
    to the node's dtype: the kernel's own formula, not Range's repeated additions."""
    start, step = node.attr("start", 0), node.attr("step", 1)
    work = "float64" if isinstance(start, float) or isinstance(step, float) else "int64"
    n = node.shape[0]
    index = b.add("Range", [b.const(np.array(0, np.int64), f"{node.id}/zero"),
                            b.const(np.array(n, np.int64), f"{node.id}/n"),
                            b.const(np.array(1, np.int64), f"{node.id}/one")])
    value = b.cast(index, "int64", work)
    if step != 1:
        value = b.add("Mul", [value, b.const(np.array(step, work), f"{node.id}/step")])
    if start != 0:
        value = b.add("Add", [value, b.const(np.array(start, work), f"{node.id}/start")])
    b.cast(value, work, node.dtype, out=out)


# -- elementwise ---------------------------------------------------------------------------
UNARY = {"neg": "Neg", "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
         "tanh": "Tanh", "sigmoid": "Sigmoid", "erf": "Erf", "sin": "Sin", "cos": "Cos",
         "tan": "Tan", "floor": "Floor", "ceil": "Ceil", "round": "Round", "sign": "Sign",
         "reciprocal": "Reciprocal", "softplus": "Softplus", "relu": "Relu", "gelu": None,
         "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh"}
# computed in float32 for float16 operands, as the kernels compute them
HALF_IN_FLOAT32 = ("sigmoid", "gelu", "erf", "reciprocal", "softplus")
GELU_C, GELU_K = 0.044715, float(np.sqrt(2.0 / np.pi))


@_exporter(*UNARY)
def _unary(b, node, args, out):
    (x,) = args
    op, dtype = node.op, node.dtype
    integral = not dtypes.is_float(dtype)
    if (op in ("floor", "ceil", "round") and integral) or \
            (op in ("abs", "relu") and (dtype == "bool" or _unsigned(dtype))):
        b.cast(x.name, x.dtype, dtype, out=out)  # integers (and bools) are left as they are
        return
    if op == "relu" and integral:
        value, work = _compute(b, x, dtype, MINMAX_TYPES)
        zero = b.const(np.array(0, work), f"{node.id}/zero")
        b.cast(b.add("Max", [value, zero]), work, dtype, out=out)
        return
    if op == "neg" and _unsigned(dtype):  # wraps modulo 2**bits, as NumPy's negative
        zero = b.const(np.array(0, dtype), f"{node.id}/zero")
        b.add("Sub", [zero, x.name], out=out)
        return
    work = "float32" if dtype == "float16" and op in HALF_IN_FLOAT32 else dtype
    value = b.cast(x.name, x.dtype, work)
    if op == "gelu":
        value = _gelu(b, node, value, work)
    else:
        value = b.add(UNARY[op], [value])
    b.cast(value, work, dtype, out=out)


def _gelu(b, node, x: str, dtype: str) -> str:
    """((tanh((x + C (x x x)) K) + 1) x) 0.5, in the kernels' order of operations."""
    def c(value, what):
        return b.const(np.array(value, dtype), f"{node.id}/{what}")
    cube = b.add("Mul", [b.add("Mul", [x, x]), x])
    inner = b.add("Mul", [b.add("Add", [x, b.add("Mul", [c(GELU_C, "c"), cube])]),
                          c(GELU_K, "k")])
    t = b.add("Add", [b.add("Tanh", [inner]), c(1.0, "one")])
    return b.add("Mul", [b.add("Mul", [t, x]), c(0.5, "half")])


ARITHMETIC = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
              "maximum": "Max", "minimum": "Min"}
BOOL_ARITHMETIC = {"add": "Or", "mul": "And", "maximum": "Or", "minimum": "And"}
COMPARE = {"lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
           "eq": "Equal", "ne": "Equal"}


@_exporter(*ARITHMETIC)
def _arithmetic(b, node, args, out):
    """Operands cast to the result's type (NumPy's promotion); bool sums and products are
    logical, as in NumPy; Pow of small integers runs in int64 (the same values, wrapped)."""
    dtype = node.dtype
    if dtype == "bool":
        if node.op not in BOOL_ARITHMETIC:
            raise _refuse(node, f"{node.op} of bools")
        b.add(BOOL_ARITHMETIC[node.op], [a.name for a in args], out=out)
        return
    supported = {"pow": POW_TYPES, "maximum": MINMAX_TYPES, "minimum": MINMAX_TYPES}
    work = _widened(dtype, supported.get(node.op, (dtype,)))
    operands = [b.cast(a.name, a.dtype, work) for a in args]
    b.cast(b.add(ARITHMETIC[node.op], operands), work, dtype, out=out)


@_exporter(*COMPARE)
def _compare(b, node, args, out):
    a, c = args
    common = dtypes.ufunc_result(np.add, a.dtype, c.dtype)
    if common == "bool" and node.op not in ("eq", "ne"):
        common = "uint8"  # Less and Greater have no bool kernels; False < True as 0 < 1
    operands = [b.cast(v.name, v.dtype, common) for v in args]
    if node.op == "ne":
        b.add("Not", [b.add("Equal", operands)], out=out)
    else:
        b.add(COMPARE[node.op], operands, out=out)


@_exporter("where")
def _where(b, node, args, out):
    cond, x, y = args
    work = _widened(node.dtype, WHERE_TYPES)
    chosen = b.add("Where", [cond.name, b.cast(x.name, x.dtype, work),
                             b.cast(y.name, y.dtype, work)])
    b.cast(chosen, work, node.dtype, out=out)


@_exporter("cast")
def _cast(b, node, args, out):
    (x,) = args
    b.cast(x.name, x.dtype, node.dtype, out=out, always=True)


# -- matrix products, reductions, softmax --------------------------------------------------
@_exporter("matmul")
def _matmul(b, node, args, out):
    """MatMul in the result's type; bools as int64 products (any pair of trues is true)."""
    work = _widened(node.dtype, MATMUL_TYPES)
    if node.dtype == "bool":
        work = "int64"
    operands = [b.cast(a.name, a.dtype, work) for a in args]
    product = b.add("MatMul", operands)
    if node.dtype == "bool":
        zero = b.const(np.array(0, np.int64), f"{node.id}/zero")
        b.add("Greater", [product, zero], out=out)
        return
    b.cast(product, work, node.dtype, out=out)


REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "prod": "ReduceProd", "max": "ReduceMax",
          "min": "ReduceMin"}


@_exporter(*REDUCE)
def _reduce(b, node, args, out):
    """The operand cast to the result's type first (NumPy sums int32 as int64, averages
    integers as float64); float16 sums, means and products add up in float32."""
    (x,) = args
    axes, keep = node.attr("axes"), node.attr("keepdims", False)
    if node.op in ("sum", "mean", "prod"):
        work = "float32" if node.dtype == "float16" else _widened(node.dtype, SUM_TYPES)
    else:
        work = _widened(node.dtype, EXTREME_TYPES)
    value = b.cast(x.name, x.dtype, work)
    if not axes:  # nothing reduced (ONNX's empty axes would mean every axis)
        b.cast(value, work, node.dtype, out=out, always=True)
        return
    attrs = {"keepdims": int(keep)}
    inputs = [value]
    if b.opset >= (13 if node.op == "sum" else 18):
        inputs.append(b.const(np.array(axes, dtype=np.int64), f"{node.id}/axes"))
    else:
        attrs["axes"] = list(axes)
    reduced = b.add(REDUCE[node.op], inputs, **attrs)
    b.cast(reduced, work, node.dtype, out=out)


# ONNX Runtime's CPU CumSum kernels (ONNX's own list adds uint32, uint64, float16, bfloat16).
CUMSUM_TYPES = ("int32", "int64", "float32", "float64")


@_exporter("cumsum")
def _cumsum(b, node, args, out):
    """CumSum with its axis as a constant, on the operand cast to the result's type (NumPy
    sums bools and small integers in int64, which ONNX's CumSum, keeping its input's type,
    would not); float16 adds up in float32, uint64 in int64 (the same sums modulo 2**64)."""
    (x,) = args
    work = "float32" if node.dtype == "float16" else _widened(node.dtype, CUMSUM_TYPES)
    value = b.cast(x.name, x.dtype, work)
    axis = b.const(np.array(node.attr("axis"), dtype=np.int64), f"{node.id}/axis")
    summed = b.add("CumSum", [value, axis], exclusive=int(node.attr("exclusive")),
                   reverse=int(node.attr("reverse")))
    b.cast(summed, work, node.dtype, out=out)


@_exporter("softmax", "log_softmax")
def _softmax(b, node, args, out):
    (x,) = args
    value = b.cast(x.name, x.dtype, node.dtype)
    b.add("Softmax" if node.op == "softmax" else "LogSoftmax", [value], out=out,
          axis=node.attr("axis"))


# -- layout --------------------------------------------------------------------------------
@_exporter("transpose")
def _transpose(b, node, args, out):
    b.add("Transpose", [args[0].name], out=out, perm=list(node.attr("axes")))


@_exporter("reshape")
def _reshape(b, node, args, out):
    """The target shape as a constant; a dimension that is symbolic (the batch) is written
    as 0, ONNX's "copy this dimension of the input" (`export.symbolic_dims` has checked that
    the input has it at the same position)."""
    (x,) = args
    dims = b.dims[node.id]
    if any(d is not None for d in x.dims) and _squeezes(b, node, x, out):
        return
    spec = [0 if d is not None else s for s, d in zip(node.shape, dims)]
    attrs = {}
    if 0 in node.shape:  # a real zero, not a copy
        if any(d is not None for d in dims) or b.opset < 14:
            raise _refuse(node, "a reshape to a shape with a 0 needs allowzero (opset 14 "
                                "or newer) and no dynamic axis")
        attrs["allowzero"] = 1
    shape = b.const(np.array(spec, dtype=np.int64), f"{node.id}/shape")
    b.add("Reshape", [x.name, shape], out=out, **attrs)


def _squeezes(b, node, x: Arg, out: str) -> bool:
    """A reshape that moves a dynamic axis by dropping or adding axes of size 1 (the
    (1, N, C) -> (N, C) of a Squeeze an exporter wrote), written as Squeeze and Unsqueeze:
    a Reshape's fixed target could not hold the dynamic size. False for any other."""
    pairs = squeezed_axes(x.shape, x.dims, node.shape)
    if pairs is None or all(i == o for i, o in pairs):
        return False
    kept_in, kept_out = {i for i, _ in pairs}, {o for _, o in pairs}
    dropped = [i for i in range(len(x.shape)) if i not in kept_in]
    added = [o for o in range(node.ndim) if o not in kept_out]
    value = x.name
    if dropped:
        value = b.add("Squeeze", [value, b.const(np.array(dropped, np.int64),
                                                 f"{node.id}/squeeze")],
                      out=None if added else out)
    if added:
        b.add("Unsqueeze", [value, b.const(np.array(added, np.int64), f"{node.id}/unsqueeze")],
              out=out)
    return True


@_exporter("concat")
def _concat(b, node, args, out):
    b.add("Concat", [b.cast(a.name, a.dtype, node.dtype) for a in args], out=out,
          axis=node.attr("axis"))


@_exporter("slice")
def _slice(b, node, args, out):
    """Slice on the axes not taken whole (a dynamic axis always is: `symbolic_dims`)."""
    (x,) = args
    cut = [(axis, lo, hi, step) for axis, (lo, hi, step, size) in enumerate(zip(
        node.attr("starts"), node.attr("stops"), node.attr("steps"), x.shape))
        if (lo, hi, step) != (0, size, 1)]
    if not cut:
        b.add("Identity", [x.name], out=out)
        return
    axes, starts, stops, steps = (np.array(column, dtype=np.int64) for column in zip(*cut))
    b.add("Slice", [x.name, b.const(starts, f"{node.id}/starts"),
                    b.const(stops, f"{node.id}/ends"), b.const(axes, f"{node.id}/axes"),
                    b.const(steps, f"{node.id}/steps")], out=out)


@_exporter("flip")
def _flip(b, node, args, out):
    """ONNX's Slice stepping -1 from the last element past the first (any length: a dynamic
    axis may be flipped)."""
    (x,) = args
    axes = np.array(node.attr("axes"), dtype=np.int64)
    last = np.full(len(axes), -1, dtype=np.int64)
    past_first = np.full(len(axes), np.iinfo(np.int64).min, dtype=np.int64)
    b.add("Slice", [x.name, b.const(last, f"{node.id}/starts"),
                    b.const(past_first, f"{node.id}/ends"), b.const(axes, f"{node.id}/axes"),
                    b.const(last, f"{node.id}/steps")], out=out)


@_exporter("take")
def _take(b, node, args, out):
    x, indices = args
    index = b.cast(indices.name, indices.dtype, _widened(indices.dtype, ("int32", "int64")))
    b.add("Gather", [x.name, index], out=out, axis=node.attr("axis"))


# Where ONNX takes each scatter reduction from.
REDUCTION_OPSET = {"none": 13, "add": 16, "mul": 16, "max": 18, "min": 18}


@_exporter("scatter_elements", "scatter_nd")
def _scatter(b, node, args, out):
    x, indices, updates = args
    reduction = node.attr("reduction")
    if b.opset < REDUCTION_OPSET[reduction]:
        raise _refuse(node, f"reduction {reduction!r} comes to ONNX's scatters in opset "
                            f"{REDUCTION_OPSET[reduction]}: export with that opset or newer")
    index = b.cast(indices.name, indices.dtype, "int64")
    attrs = {} if reduction == "none" else {"reduction": reduction}
    if node.op == "scatter_elements":
        attrs["axis"] = node.attr("axis")
    # ONNX leaves repeated indices of reduction none undefined; deepx_flow's last-wins rule
    # is what ONNX Runtime's CPU kernels do, but another runtime may differ.
    b.add("ScatterElements" if node.op == "scatter_elements" else "ScatterND",
          [x.name, index, updates.name], out=out, **attrs)


@_exporter("gather_elements", "gather_nd")
def _gather_indexed(b, node, args, out):
    x, indices = args
    index = b.cast(indices.name, indices.dtype, "int64")
    if node.op == "gather_elements":
        b.add("GatherElements", [x.name, index], out=out, axis=node.attr("axis"))
    else:
        b.add("GatherND", [x.name, index], out=out)


# -- convolution and pooling ---------------------------------------------------------------
def _window_attrs(node, spatial: int) -> dict:
    def get(name, default, length):
        value = node.attr(name)
        return list(value) if value is not None else [default] * length
    return {"strides": get("strides", 1, spatial), "pads": get("pads", 0, 2 * spatial),
            "dilations": get("dilations", 1, spatial)}


@_exporter("conv")
def _conv(b, node, args, out):
    x, w = args
    attrs = _window_attrs(node, len(x.shape) - 2)
    b.add("Conv", [x.name, w.name], out=out, kernel_shape=list(w.shape[2:]),
          group=node.attr("groups", 1), **attrs)


@_exporter("max_pool")
def _max_pool(b, node, args, out):
    """MaxPool skips padding, as deepx_flow's does; integers other than int8 and uint8 pool
    in float64 (exact up to 32 bits); 64-bit integers are refused."""
    (x,) = args
    if x.dtype in ("int64", "uint64"):
        raise _refuse(node, f"ONNX's MaxPool has no {x.dtype} kernel and float64 does not "
                            "hold every value; cast to float64 first if that is close enough")
    value, work = _compute(b, x, x.dtype, MAX_POOL_TYPES)
    attrs = _window_attrs(node, len(x.shape) - 2)
    pooled = b.add("MaxPool", [value], kernel_shape=list(node.attr("kernel")), **attrs)
    b.cast(pooled, work, node.dtype, out=out)


@_exporter("avg_pool")
def _avg_pool(b, node, args, out):
    (x,) = args
    attrs = _window_attrs(node, len(x.shape) - 2)
    if all(d == 1 for d in attrs["dilations"]):
        del attrs["dilations"]
    elif b.opset < 19:
        raise _refuse(node, "AveragePool takes dilations from opset 19: export with "
                            "opset=19 or newer")
    b.add("AveragePool", [x.name], out=out, kernel_shape=list(node.attr("kernel")),
          count_include_pad=int(node.attr("count_include_pad", 0)), **attrs)


def squeezed_axes(shape, dims, new_shape) -> list[tuple[int, int]] | None:
    """For a reshape that only drops or adds axes of size 1 (none of them dynamic), the
    (input axis, output axis) of each axis it keeps; None for any other reshape."""
    kept_in = [i for i, s in enumerate(shape) if s != 1 or dims[i] is not None]
    kept_out = [o for o, s in enumerate(new_shape) if s != 1]
    if [shape[i] for i in kept_in] != [new_shape[o] for o in kept_out]:
        return None
    return list(zip(kept_in, kept_out))
