"""The operator functions of the SDK: `dx.relu(x)`, `dx.matmul(a, b)`, `dx.full(...)`, ...

Each builds one node through `apply`, which runs the operator's type rule at once. Arguments
are normalized here (axes made non-negative, -1 in a reshape resolved) so that nodes, and the
YAML written from them, are explicit.
"""

from __future__ import annotations

import builtins
import math
import operator
from typing import Sequence

import numpy as np

from deepx_flow.compiler.infer import infer_node
from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.ir.node import Node
from deepx_flow.ops.common import flag, is_integer, is_number, normalize_axis
from deepx_flow.ops.sources import MISSING
from deepx_flow.sdk.tensor import Tensor, apply, as_tensor, binary, reduce_


def _shape(shape) -> tuple[int, ...]:
    """A shape as a tuple of Python ints: an int or a sequence of ints (NumPy's included).

    Nothing is converted that is not already an integer: `int(2.9)` would silently make a
    (2, 3) tensor of what was written (2.9, 3).
    """
    dims = (shape,) if is_integer(shape) else shape
    if not isinstance(dims, (tuple, list)) or not all(is_integer(s) for s in dims):
        raise GraphError(f"shape must be an integer or a sequence of integers, got "
                         f"{shown(shape)}")
    return tuple(operator.index(s) for s in dims)


# -- sources ------------------------------------------------------------------------------
def input(name: str, shape: Sequence[int], dtype="float32") -> Tensor:  # noqa: A001
    """A named graph input; its data is passed to `dx.run(inputs={name: array})`."""
    if not isinstance(name, str) or not name.isidentifier():
        raise GraphError(f"input name must be an identifier, got {shown(name)}")
    node = Node(name, "input", (), _shape(shape), dtypes.normalize(dtype, name))
    return Tensor(infer_node(node, []), (), name)


def read_zarr(uri: str, missing: str = "error") -> Tensor:
    """A stored Zarr array (a local path or any fsspec URL) as a tensor.

    Its shape, dtype and chunk shape are read now; its data is read chunk by chunk by the
    tasks that need it (the compiler aligns their chunks with the stored ones where it can),
    each chunk checked as it is read. A chunk that is not stored is a `dx.DataError`, unless
    `missing="fill"`: then it reads as the array's fill value, as Zarr itself does (for
    arrays written by tools that skip chunks equal to the fill value).
    """
    if not isinstance(missing, str) or missing not in MISSING:
        raise GraphError(f"read_zarr: missing must be one of {', '.join(MISSING)}, got "
                         f"{shown(missing)}")
    return _read_zarr(uri, missing=missing)


def _read_zarr(uri, **attrs) -> Tensor:
    from deepx_flow.storage.readers import storage_chunks, zarr_info
    shape, dtype = zarr_info(str(uri))
    chunks = storage_chunks(str(uri))
    attrs = {k: v for k, v in attrs.items() if v is not None and (k, v) != ("missing", "error")}
    return apply("read_zarr", [], shape=shape, dtype=dtype, uri=str(uri),
                 **({"storage_chunks": chunks} if chunks else {}), **attrs)


def full(shape, value, dtype=None) -> Tensor:
    """A tensor of `shape` filled with `value` (dtype inferred from the value if not given)."""
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int64" if isinstance(value, int) \
            else "float64"
    return apply("full", [], shape=_shape(shape), dtype=dtypes.normalize(dtype), value=value)


def zeros(shape, dtype="float32") -> Tensor:
    """A tensor of `shape` filled with zeros (False for bool): `full(shape, 0, dtype)`."""
    return full(shape, False if dtypes.normalize(dtype) == "bool" else 0, dtype)


def ones(shape, dtype="float32") -> Tensor:
    """A tensor of `shape` filled with ones (True for bool): `full(shape, 1, dtype)`."""
    return full(shape, True if dtypes.normalize(dtype) == "bool" else 1, dtype)


def arange(start, stop=None, step=1, dtype=None) -> Tensor:
    """`start, start + step, ...` below `stop`, like `numpy.arange`."""
    if stop is None:
        start, stop = 0, start
    start, stop, step = (v.item() if isinstance(v, np.generic) else v for v in (start, stop, step))
    # With a float among them, all are computed with as floats (NumPy's rule).
    floats = any(isinstance(v, float) for v in (start, stop, step))
    for name, value in (("start", start), ("stop", stop), ("step", step)):
        try:
            finite = is_number(value) and (not floats or math.isfinite(float(value)))
        except OverflowError:  # an int past any float
            finite = False
        if not finite:
            raise GraphError(f"arange: {name} must be a finite number, got {shown(value)}")
    if step == 0:
        raise GraphError("arange: step must not be zero")
    try:
        n = builtins.max(0, math.ceil((stop - start) / step)) if floats \
            else builtins.max(0, -(-(stop - start) // step))
    except OverflowError:  # a count past any float
        raise GraphError(f"arange({shown(start)}, {shown(stop)}, {shown(step)}) has too many "
                         f"elements for a tensor") from None
    if dtype is None:
        dtype = "float64" if any(isinstance(v, float) for v in (start, stop, step)) else "int64"
    return apply("arange", [], shape=(int(n),), dtype=dtypes.normalize(dtype),
                 start=start, step=step)


# -- elementwise --------------------------------------------------------------------------
def _unary(op):
    def fn(x) -> Tensor:
        return apply(op, [as_tensor(x)])
    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op}."
    return fn


neg, abs, exp, log, sqrt, tanh, sigmoid, relu, gelu, erf = (  # noqa: A001
    _unary(op) for op in ("neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu",
                          "erf"))
sin, cos, tan, floor, ceil, round, sign, reciprocal, softplus = (  # noqa: A001
    _unary(op) for op in ("sin", "cos", "tan", "floor", "ceil", "round", "sign", "reciprocal",
                          "softplus"))
sinh, cosh, asinh, acosh, atanh = (_unary(op) for op in ("sinh", "cosh", "asinh", "acosh",
                                                         "atanh"))
round.__doc__ = "Elementwise round to the nearest integer, halves to even (NumPy's rint)."


def _binary(op):
    def fn(a, b) -> Tensor:
        return binary(op, a, b)
    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op}, with NumPy broadcasting."
    return fn


add, sub, mul, div, pow, maximum, minimum = (  # noqa: A001
    _binary(op) for op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"))
less, less_equal, greater, greater_equal, equal, not_equal = (
    _binary(op) for op in ("lt", "le", "gt", "ge", "eq", "ne"))


def where(cond, a, b) -> Tensor:
    """`a` where `cond` is true, else `b` (broadcasting all three)."""
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    return apply("where", [as_tensor(cond), as_tensor(a, like), as_tensor(b, like)])


def clip(x, lo=None, hi=None) -> Tensor:
    """`x` limited to [lo, hi] (either may be None: no limit on that side); NaN stays NaN,
    as in NumPy. lo and hi broadcast against x."""
    x = as_tensor(x)
    if lo is None and hi is None:
        raise GraphError("clip needs lo, hi or both")
    if lo is not None:
        x = maximum(x, as_tensor(lo, x))
    if hi is not None:
        x = minimum(x, as_tensor(hi, x))
    return x


def cast(x: Tensor, dtype) -> Tensor:
    return apply("cast", [as_tensor(x)], dtype=dtypes.normalize(dtype))


# -- linear algebra -----------------------------------------------------------------------
def matmul(a, b) -> Tensor:
    """Matrix product; 1-D operands are treated as in NumPy (a row or a column vector)."""
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim == 1 and b.ndim == 1:
        return reshape(matmul(reshape(a, (1, a.shape[0])), reshape(b, (b.shape[0], 1))), ())
    if a.ndim == 1:
        out = matmul(reshape(a, (1, a.shape[0])), b)
        return reshape(out, out.shape[:-2] + out.shape[-1:])
    if b.ndim == 1:
        out = matmul(a, reshape(b, (b.shape[0], 1)))
        return reshape(out, out.shape[:-1])
    return apply("matmul", [a, b])


# -- reductions ---------------------------------------------------------------------------
def sum(x, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    return reduce_("sum", as_tensor(x), axis, keepdims)


def mean(x, axis=None, keepdims=False) -> Tensor:
    return reduce_("mean", as_tensor(x), axis, keepdims)


def prod(x, axis=None, keepdims=False) -> Tensor:
    """The product over `axis` (all axes when None), multiplied up in float64 for floats
    (rounded once to the result dtype, NumPy's: int32 gives int64); 1 for an empty axis."""
    return reduce_("prod", as_tensor(x), axis, keepdims)


def max(x, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    return reduce_("max", as_tensor(x), axis, keepdims)


def min(x, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    return reduce_("min", as_tensor(x), axis, keepdims)


def take(x, indices, axis: int = 0) -> Tensor:
    """The elements of `x` at integer `indices` along `axis`, as `np.take` (an embedding
    lookup is `take(table, ids)`). An index outside `-n..n-1` is an error at run time."""
    x, indices = as_tensor(x), as_tensor(indices)
    return apply("take", [x, indices], axis=_axis("take", x, axis))


def take_along_axis(x, indices, axis: int = 0) -> Tensor:
    """`np.take_along_axis` (ONNX's GatherElements): `out[i, j, ...]` is `x` at the position
    `(i, j, ...)` with its `axis` coordinate replaced by `indices[i, j, ...]`. `indices` has
    x's rank and is at most as long along the other axes. An index outside `-n..n-1` is an
    error at run time."""
    x, indices = as_tensor(x), as_tensor(indices)
    return apply("gather_elements", [x, indices], axis=_axis("gather_elements", x, axis))


def scatter(x, indices, updates, axis: int = 0, reduction: str = "none") -> Tensor:
    """A copy of `x` with `updates` written at `indices` along `axis` (ONNX's
    ScatterElements; `np.put_along_axis`, or `ufunc.at` with a reduction).

    Parameters
    ----------
    x : Tensor
        The tensor written into.
    indices : Tensor
        Integers of x's rank, at most as long as `x` along every axis but `axis` (only that
        leading region of x is written). Negative ones count from the end; one outside
        `-n..n-1` is an ExecutionError naming it when the run meets it.
    updates : Tensor or scalar
        Values of the indices' shape and x's dtype (a Python scalar is broadcast to it).
    axis : int
        The axis the indices point along.
    reduction : {"none", "add", "mul", "max", "min"}
        How an update combines with what is there. With "none" and an index repeated
        along `axis`, the last update in C order of the indices wins (ONNX leaves this
        undefined; here it holds on every chunk grid).

    Returns
    -------
    Tensor
        Of x's shape and dtype. Chunked like `x` along every axis but `axis`, which each
        task holds whole; gradients flow for "none" and "add" (`ops/scatter.py`).
    """
    x, indices = as_tensor(x), as_tensor(indices)
    updates = _updates(x, updates, indices.shape)
    return apply("scatter_elements", [x, indices, updates],
                 axis=_axis("scatter_elements", x, axis), reduction=reduction)


def scatter_add(x, indices, updates, axis: int = 0) -> Tensor:
    """`scatter(x, indices, updates, axis, reduction="add")`: every update is added at its
    position, repeated indices included (`np.add.at`)."""
    return scatter(x, indices, updates, axis, reduction="add")


def scatter_nd(x, indices, updates, reduction: str = "none") -> Tensor:
    """A copy of `x` where each row of `indices` (its last axis, of length k, holds positions
    along x's first k axes) writes its block `updates[row]` of shape `x.shape[k:]` (ONNX's
    ScatterND). `updates` has shape `indices.shape[:-1] + x.shape[k:]` (a Python scalar is
    broadcast to it); `reduction` and repeated rows as in `scatter`. Chunked along x's last
    axes only: each task holds x's first k axes whole and reads every index row."""
    x, indices = as_tensor(x), as_tensor(indices)
    k = indices.shape[-1] if indices.ndim else 0
    updates = _updates(x, updates, indices.shape[:-1] + x.shape[k:])
    return apply("scatter_nd", [x, indices, updates], reduction=reduction)


def gather_nd(x, indices) -> Tensor:
    """The blocks of `x` at the rows of `indices` (ONNX's GatherND without batch axes): the
    last axis of `indices` (of length k) holds positions along x's first k axes; the result
    has shape `indices.shape[:-1] + x.shape[k:]`."""
    return apply("gather_nd", [as_tensor(x), as_tensor(indices)])


def _updates(x: Tensor, updates, shape) -> Tensor:
    """A scatter's updates; a Python number becomes a constant of x's dtype and `shape`."""
    if isinstance(updates, Tensor):
        return updates
    if is_number(updates) or isinstance(updates, bool):
        return full(tuple(shape), updates, dtype=x.dtype)
    return as_tensor(updates)


def cumsum(x, axis: int | None = 0, exclusive: bool = False, reverse: bool = False) -> Tensor:
    """The running sums of `x` along `axis` (`np.cumsum`; ONNX's CumSum).

    Parameters
    ----------
    x : Tensor
        The tensor to scan.
    axis : int or None
        The axis to sum along (negative counts from the end); None scans the flattened
        tensor, as NumPy does.
    exclusive : bool
        Leave each element out of its own sum (the first result is 0).
    reverse : bool
        Sum from the end of the axis instead.

    Returns
    -------
    Tensor
        Of x's shape and NumPy's dtype for `np.cumsum` (bools and narrower integers sum in
        int64 or uint64, wrapping as NumPy's do; floats keep their dtype). Float sums add
        up in float64 and are rounded once, as `sum`'s do. One operator (`ops/scan.py`),
        chunked like x: each chunk is scanned with the carry of the chunks before it, so
        the work is linear in the elements on any chunk grid.
    """
    x = as_tensor(x)
    if axis is None:
        x, axis = reshape(x, (x.size,)), 0
    return apply("cumsum", [x], axis=_axis("cumsum", x, axis), exclusive=exclusive,
                 reverse=reverse)


def argmax(x, axis=None, keepdims=False) -> Tensor:
    """The index of the largest value along `axis` (of the flattened tensor when None), as
    int64: the first one where values tie, the first NaN where there is one, as in NumPy."""
    return _arg_extreme("argmax", as_tensor(x), axis, keepdims)


def argmin(x, axis=None, keepdims=False) -> Tensor:
    """The index of the smallest value along `axis`, as `argmax` finds the largest."""
    return _arg_extreme("argmin", as_tensor(x), axis, keepdims)


def _arg_extreme(op: str, x: Tensor, axis, keepdims: bool) -> Tensor:
    """Composed of operators the compiler chunks and fuses already: the extreme along the
    axis, then the smallest index holding it (or holding a NaN, which NumPy reports first),
    so the axis may be split over chunks like any reduction's."""
    if axis is None:
        if flag(keepdims, f"{op}: keepdims"):
            raise GraphError(f"{op}: keepdims needs an axis")
        return _arg_extreme(op, reshape(x, (x.size,)), 0, False)
    axis = _axis(op, x, axis)
    if x.shape[axis] == 0:
        raise GraphError(f"{op} of an empty axis has no index (operand: {x.node.id}{x.shape})")
    extreme = reduce_("max" if op == "argmax" else "min", x, axis, keepdims=True)
    n = x.shape[axis]
    index = reshape(arange(n, dtype="int64"), tuple(n if a == axis else 1
                                                    for a in range(x.ndim)))
    at = where(x != x, index, where(x == extreme, index, n)) if dtypes.is_float(x.dtype) \
        else where(x == extreme, index, n)
    return reduce_("min", at, axis, keepdims)


def _axis(op: str, x: Tensor, axis) -> int:
    """`axis` made non-negative; an error names the operator being built and its operand."""
    try:
        return normalize_axis(Node(f"new {op}", op, (x.node.id,), x.shape, x.dtype), axis,
                              x.ndim)
    except GraphError as err:
        raise GraphError(f"{err} (operand: {x.node.id}{x.shape})") from None


def softmax(x, axis=-1) -> Tensor:
    x = as_tensor(x)
    return apply("softmax", [x], axis=_axis("softmax", x, axis))


def log_softmax(x, axis=-1) -> Tensor:
    x = as_tensor(x)
    return apply("log_softmax", [x], axis=_axis("log_softmax", x, axis))


# -- layout -------------------------------------------------------------------------------
def transpose(x, axes=None) -> Tensor:
    x = as_tensor(x)
    if axes is not None and not isinstance(axes, (tuple, list)):
        raise GraphError(f"transpose: axes must be a list of the {x.ndim} axes in their new "
                         f"order (or None), got {shown(axes)} (operand: {x.node.id}{x.shape})")
    axes = tuple(reversed(range(x.ndim))) if axes is None else \
        tuple(_axis("transpose", x, a) for a in axes)
    return apply("transpose", [x], axes=axes)


def flip(x, axis=None) -> Tensor:
    """`x` with the order of its elements reversed along `axis` (an int, a list of them, or
    None for every axis), as `np.flip`."""
    x = as_tensor(x)
    if axis is None:
        axes = tuple(range(x.ndim))
    elif isinstance(axis, (tuple, list)):
        axes = tuple(_axis("flip", x, a) for a in axis)
    else:
        axes = (_axis("flip", x, axis),)
    if len(set(axes)) != len(axes):
        raise GraphError(f"flip: repeated axis in {shown(axis)} (operand: "
                         f"{x.node.id}{x.shape})")
    if not axes or all(x.shape[a] <= 1 for a in axes):
        return x  # nothing moves
    return apply("flip", [x], axes=tuple(sorted(axes)))


def reshape(x, shape) -> Tensor:
    x = as_tensor(x)
    return apply("reshape", [x], shape=_shape(shape))


PAD_MODES = ("constant", "edge", "reflect", "wrap")


def pad(x, widths, mode: str = "constant", value=0) -> Tensor:
    """`x` padded as `np.pad`: `widths` is one (before, after) per axis (or one pair for
    every axis); mode "constant" (with `value`), "edge", "reflect" (mirrored without
    repeating the edge) or "wrap". Built from `concat` (constant) and `take` with the index
    pattern NumPy's own pad gives (the others), so it chunks like them."""
    x = as_tensor(x)
    if not isinstance(mode, str) or mode not in PAD_MODES:
        raise GraphError(f"pad: mode {shown(mode)} is not one of {', '.join(PAD_MODES)}")
    try:  # NumPy's forms: w, (w,), (before, after), ((before, after),), one pair per axis
        pairs = np.broadcast_to(np.asarray(widths, dtype=object), (x.ndim, 2)) \
            if np.ndim(widths) <= 1 else np.asarray(widths, dtype=object)
    except (ValueError, TypeError):  # ragged, or not of a shape that broadcasts
        pairs = None
    if pairs is None or pairs.shape != (x.ndim, 2) or \
            not all(is_integer(w) and w >= 0 for w in pairs.flat):
        raise GraphError(f"pad: widths must be (before, after) non-negative integers for each "
                         f"of the {x.ndim} axes, got {shown(widths)}")
    for axis, (before, after) in enumerate(pairs.tolist()):
        if not before and not after:
            continue
        n = x.shape[axis]
        if mode == "constant":
            parts = []
            for width in (before, after):
                shape = x.shape[:axis] + (width,) + x.shape[axis + 1:]
                parts.append(full(shape, value, dtype=x.dtype) if width else None)
            x = concat([p for p in (parts[0], x, parts[1]) if p is not None], axis=axis)
            continue
        if n == 0 or (mode == "reflect" and n == 1 and (before or after)):
            raise GraphError(f"pad: mode {mode} needs {'2' if mode == 'reflect' else '1'} or "
                             f"more elements along axis {axis}, which has {n}")
        index = np.pad(np.arange(n, dtype=np.int64), (before, after), mode=mode)
        x = take(x, _index_input(index), axis=axis)
    return x


def _index_input(index: np.ndarray) -> Tensor:
    """A constant integer vector as a graph tensor with no input to bind: the concat of its
    runs of repeated, rising or falling consecutive values, each an arange or a full."""
    parts, i, n = [], 0, len(index)
    while i < n:
        j, step = i + 1, 1
        if j < n and builtins.abs(int(index[j]) - int(index[i])) <= 1:
            step = int(index[j]) - int(index[i])
            while j + 1 < n and int(index[j + 1]) - int(index[j]) == step:
                j += 1
            j += 1
        first, length = int(index[i]), j - i
        parts.append(full((length,), first, dtype="int64") if step == 0 else
                     arange(first, first + step * length, step, dtype="int64"))
        i = j
    return parts[0] if len(parts) == 1 else concat(parts)


def concat(tensors, axis=0) -> Tensor:
    if not isinstance(tensors, (list, tuple)):
        raise GraphError(f"concat takes a list of tensors, got {shown(tensors)}")
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise GraphError("concat needs at least one tensor")
    if tensors[0].ndim == 0:
        raise GraphError("concat needs tensors of at least 1 dimension; reshape 0-d tensors "
                         "to (1,) first")
    return apply("concat", tensors, axis=_axis("concat", tensors[0], axis))


concatenate = concat
