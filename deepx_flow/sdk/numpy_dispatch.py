"""NumPy's functions on `dx.Tensor`: `np.exp(t)`, `np.sum(t, axis=1)`, `np.matmul(a, b)`.

NumPy hands a call with a Tensor among its operands to the Tensor (NEP 13's
`__array_ufunc__` for ufuncs, NEP 18's `__array_function__` for the rest), and the tables
here build the node that the dx function of the same meaning builds: `np.exp(t)` is
`dx.exp(t)`, node for node. A NumPy array among the operands becomes a constant input
(`sdk/bindings.py`), a NumPy scalar a constant of its dtype, a Python scalar a "weak"
constant, as in `t + 1.0`.

What is refused, with a `NumpyInteropError` naming the function and saying what to do:

- a function or ufunc with no operator here (`np.log10`, `np.linalg.svd`), and ufunc methods
  other than `add.reduce`, `maximum.reduce`, `minimum.reduce` and `add.accumulate`;
- arguments a graph node cannot honour: `out=` (there is no buffer to write into),
  `where=` masks, `initial=`, `order="F"`, `mode=` other than NumPy's default, `decimals=`
  other than 0, ...; they are never ignored;
- a ufunc whose result dtype would differ from NumPy's (`np.rint` of integers is float in
  NumPy, `dx.round` keeps integers; `np.reciprocal` of integers): the dx function is named;
- turning a Tensor into an array (`np.asarray(t)`, `np.array(t)`, `list(t)`): a Tensor is
  lazy, and NumPy would otherwise iterate it element by element. `dx.run(t)` or
  `t.compute()` gives the array.

`NumpyInteropError` is a `GraphError` (raised where the graph is built, like every mistake
in building one) and a `TypeError`, which NumPy code expects when an operation does not
apply to a type (NumPy raises TypeError itself when no `__array_function__` accepts a call).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.sdk import functions as F
from deepx_flow.sdk.tensor import Tensor, as_tensor


class NumpyInteropError(GraphError, TypeError):
    """A NumPy function or conversion that a lazy `dx.Tensor` cannot serve: no operator for
    it, an argument a graph node cannot honour, or a conversion to an array."""


NO_VALUE = np._NoValue  # NumPy's own "not given", which its signatures use as defaults

ALTERNATIVES = ("use the dx functions (`deepx-flow ops` lists the operators), or compute the "
                "tensor first (dx.run(t) or t.compute() returns a NumPy array) and call NumPy "
                "on the array")


def refuse_conversion(t: Tensor, how: str):
    """Raise the error for turning `t` into an array (`__array__`, `__iter__`)."""
    label = f"'{t.name}' " if t.name else ""
    raise NumpyInteropError(
        f"a dx.Tensor {label}{t.shape} {t.dtype} is lazy: it has no values until it runs, so "
        f"{how} cannot make an array of it. Call dx.run(t) or t.compute() for the NumPy "
        f"array; NumPy functions with a deepx_flow operator (np.exp, np.sum, np.matmul, ...) "
        f"build graph nodes instead", t.node.id)


def _name(fn) -> str:
    module = getattr(fn, "__module__", None) or "numpy"
    return f"{module}.{fn.__name__}" if not isinstance(fn, np.ufunc) else f"numpy.{fn.__name__}"


def _no_operator(what: str):
    raise NumpyInteropError(f"{what} has no deepx_flow operator, so it cannot build a graph "
                            f"node from a dx.Tensor; {ALTERNATIVES}")


def normalize_axis_index(axis, ndim: int) -> int:
    """`axis` in `range(ndim)` (negative counts from the end), as NumPy's helper of that
    name (kept here: it moved between NumPy 1 and 2)."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or \
            not -ndim <= axis < ndim:
        raise NumpyInteropError(f"axis {shown(axis)} is out of bounds for {ndim} dimensions")
    return int(axis) % ndim if ndim else 0


def normalize_axis_tuple(axis, ndim: int, what: str = "axis") -> tuple[int, ...]:
    axes = tuple(normalize_axis_index(a, ndim) for a in
                 (axis if isinstance(axis, (tuple, list)) else (axis,)))
    if len(set(axes)) != len(axes):
        raise NumpyInteropError(f"repeated {what} in {shown(axis)}")
    return axes


def _refuse(fn: str, arg: str, value, hint: str):
    raise NumpyInteropError(f"{fn}: {arg}={shown(value)} is not supported on a dx.Tensor; "
                            f"{hint}")


OUT_HINT = "a graph node has no buffer to write into: assign the result instead"
WHERE_HINT = "choose with np.where(mask, result, other) instead"


def _check_out(fn: str, out):
    if out is not None:
        _refuse(fn, "out", out, OUT_HINT)


# -- ufuncs (NEP 13) ----------------------------------------------------------------------
def _square(x):
    return F.mul(x, x)


def _positive(x):
    return x


UFUNCS: dict[np.ufunc, Callable] = {
    np.negative: F.neg, np.absolute: F.abs, np.exp: F.exp, np.log: F.log, np.sqrt: F.sqrt,
    np.tanh: F.tanh, np.sin: F.sin, np.cos: F.cos, np.tan: F.tan, np.floor: F.floor,
    np.ceil: F.ceil, np.rint: F.round, np.sign: F.sign, np.reciprocal: F.reciprocal,
    np.sinh: F.sinh, np.cosh: F.cosh, np.arcsinh: F.asinh, np.arccosh: F.acosh,
    np.arctanh: F.atanh, np.square: _square, np.positive: _positive,
    np.add: F.add, np.subtract: F.sub, np.multiply: F.mul, np.divide: F.div,
    np.power: F.pow, np.maximum: F.maximum, np.minimum: F.minimum, np.less: F.less,
    np.less_equal: F.less_equal, np.greater: F.greater, np.greater_equal: F.greater_equal,
    np.equal: F.equal, np.not_equal: F.not_equal, np.matmul: F.matmul,
}
# the dx function named when NumPy's result dtype differs from the operator's
DX_NAMES = {np.rint: "dx.round", np.reciprocal: "dx.reciprocal", np.floor: "dx.floor",
            np.ceil: "dx.ceil"}
# ufunc keywords and the values that ask for nothing a node cannot do
NEUTRAL = {"casting": "same_kind", "order": "K", "subok": True, "where": True,
           "signature": None}


def _operands(inputs) -> list[Tensor]:
    """The ufunc's operands as tensors, as the dx functions make them: scalars typed like the
    first tensor (Python scalars weak), a 0-d array as a NumPy scalar (strong, as in NumPy),
    a list as the array NumPy makes of it."""
    like = next(v for v in inputs if isinstance(v, Tensor))
    values = [np.asarray(v) if isinstance(v, (list, tuple)) else v for v in inputs]
    values = [v[()] if isinstance(v, np.ndarray) and v.ndim == 0 else v for v in values]
    return [as_tensor(v, like) for v in values]


def array_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict):
    """`Tensor.__array_ufunc__`: see the module docstring."""
    name = _name(ufunc)
    if not all(isinstance(v, (Tensor, np.ndarray, np.generic, bool, int, float, list, tuple))
               for v in inputs):
        return NotImplemented  # another library's type: NumPy asks it, then raises
    if method == "reduce" and ufunc in REDUCERS:
        return _ufunc_reduce(ufunc, inputs, kwargs)
    if method == "accumulate" and ufunc is np.add:
        return _ufunc_accumulate(inputs, kwargs)
    if method != "__call__":
        _no_operator(f"{name}.{method}")
    fn = UFUNCS.get(ufunc)
    if fn is None:
        _no_operator(name)
    kwargs = dict(kwargs)
    _check_out(name, kwargs.pop("out", None))
    dtype = kwargs.pop("dtype", None)
    for key, value in kwargs.items():
        if key not in NEUTRAL or not _same(value, NEUTRAL[key]):
            _refuse(name, key, value, WHERE_HINT if key == "where" else
                    "leave it at NumPy's default")
    operands = _operands(inputs)
    result = fn(*operands)
    try:
        expected = dtypes.ufunc_result(ufunc, *[t.dtype for t in operands])
    except Exception:  # NumPy has no loop for these dtypes: the operator's own rule stands
        expected = result.dtype
    if result.dtype != expected:
        dx_name = DX_NAMES.get(ufunc, "deepx_flow's operator")
        raise NumpyInteropError(
            f"{name} of {', '.join(t.dtype for t in operands)} gives {expected} in NumPy, but "
            f"{dx_name} gives {result.dtype}; cast the operands first "
            f"(x.astype('{expected}')), or use {dx_name} for {result.dtype}")
    if dtype is not None and dtypes.normalize(dtype) != result.dtype:
        _refuse(name, "dtype", dtype, f"the result is {result.dtype}; cast the operands "
                f"first (x.astype(...)) or the result after (.astype(...))")
    return result


def _same(value, neutral) -> bool:
    return value is neutral or (isinstance(value, (bool, str)) and value == neutral)


REDUCERS = {np.add: F.sum, np.maximum: F.max, np.minimum: F.min}


def _ufunc_reduce(ufunc, inputs, kwargs):
    (x,) = inputs
    kwargs = dict(kwargs)
    name = f"{_name(ufunc)}.reduce"
    axis = kwargs.pop("axis", 0)
    keepdims = kwargs.pop("keepdims", False)
    dtype = kwargs.pop("dtype", None)
    _check_out(name, kwargs.pop("out", None))
    for key, value in kwargs.items():
        _refuse(name, key, value, WHERE_HINT if key == "where" else
                "reduce first, then combine with the initial value")
    return _summed(REDUCERS[ufunc], as_tensor(x), axis, keepdims, dtype)


def _ufunc_accumulate(inputs, kwargs):
    (x,) = inputs
    kwargs = dict(kwargs)
    axis = kwargs.pop("axis", 0)
    dtype = kwargs.pop("dtype", None)
    _check_out("numpy.add.accumulate", kwargs.pop("out", None))
    for key, value in kwargs.items():
        _refuse("numpy.add.accumulate", key, value, "leave it at NumPy's default")
    return _cumsum(x, axis, dtype)


def _as_dtype(x: Tensor, dtype) -> Tensor:
    dtype = dtypes.normalize(dtype)
    return x if x.dtype == dtype else F.cast(x, dtype)


# -- functions (NEP 18) -------------------------------------------------------------------
def _no(fn: str, **given):
    """Refuse every argument of `given` that is not left at NumPy's default (NO_VALUE,
    None); `out` with its own message."""
    for key, value in given.items():
        if value is not NO_VALUE and value is not None:
            _refuse(fn, key, value, OUT_HINT if key == "out" else
                    WHERE_HINT if key == "where" else "leave it at NumPy's default")


def _sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=NO_VALUE,
         where=NO_VALUE):
    _no("numpy.sum", out=out, initial=initial, where=where)
    return _summed(F.sum, as_tensor(a), axis, keepdims, dtype)


def _mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=NO_VALUE):
    _no("numpy.mean", out=out, where=where)
    return _summed(F.mean, as_tensor(a), axis, keepdims, dtype)


def _prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=NO_VALUE,
          where=NO_VALUE):
    _no("numpy.prod", out=out, initial=initial, where=where)
    return _summed(F.prod, as_tensor(a), axis, keepdims, dtype)


def _summed(fn, x: Tensor, axis, keepdims, dtype) -> Tensor:
    """`fn(x)` with NumPy's `dtype=`: the operand cast to it and the result in it. A sum of
    small integers adds up in int64 and wraps once at the end, which is what adding up in
    the small type gives (so does a product: wrapping commutes with multiplication); a
    float one adds up in float64 (`dx.sum`), more exactly than NumPy's sum in that dtype."""
    if dtype is None:
        return fn(x, axis, keepdims)
    return _as_dtype(fn(_as_dtype(x, dtype), axis, keepdims), dtype)


def _extreme(fn, dx_fn):
    def reduce(a, axis=None, out=None, keepdims=False, initial=NO_VALUE, where=NO_VALUE):
        _no(fn, out=out, initial=initial, where=where)
        return dx_fn(as_tensor(a), axis, keepdims)
    return reduce


def _arg(fn, dx_fn):
    def reduce(a, axis=None, out=None, *, keepdims=False):
        _no(fn, out=out)
        return dx_fn(as_tensor(a), axis, keepdims)
    return reduce


def _cumsum(a, axis=None, dtype=None, out=None):
    _no("numpy.cumsum", out=out)
    x = as_tensor(a)
    if dtype is None:  # dx.cumsum's dtype is NumPy's
        return F.cumsum(x, axis)
    # NumPy sums in `dtype`: a small integer one wraps as the int64 sums cast back to it do
    return _as_dtype(F.cumsum(_as_dtype(x, dtype), axis), dtype)


def _dot(a, b, out=None):
    _no("numpy.dot", out=out)
    a, b = _pair(a, b)
    if not (1 <= a.ndim <= 2 and 1 <= b.ndim <= 2):
        raise NumpyInteropError(
            f"numpy.dot of {a.ndim}-D and {b.ndim}-D operands is not a matrix product of "
            f"1-D or 2-D operands, the only ones it shares with matmul; use np.matmul (or @) "
            f"for batched products, or np.multiply for scalars")
    return F.matmul(a, b)


def _pair(a, b) -> tuple[Tensor, Tensor]:
    like = a if isinstance(a, Tensor) else b
    return as_tensor(a, like), as_tensor(b, like)


def _transpose(a, axes=None):
    return F.transpose(as_tensor(a), axes)


def _matrix_transpose(x, /):
    x = as_tensor(x)
    if x.ndim < 2:
        raise NumpyInteropError(f"numpy.matrix_transpose needs at least 2 dimensions, got "
                                f"shape {x.shape}", x.node.id)
    return F.transpose(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


def _flip(m, axis=None):
    return F.flip(as_tensor(m), axis)


def _swapaxes(a, axis1, axis2):
    x = as_tensor(a)
    axes = list(range(x.ndim))
    i, j = normalize_axis_index(axis1, x.ndim), normalize_axis_index(axis2, x.ndim)
    axes[i], axes[j] = axes[j], axes[i]
    return F.transpose(x, tuple(axes))


def _moveaxis(a, source, destination):
    x = as_tensor(a)
    source = normalize_axis_tuple(source, x.ndim, "source")
    destination = normalize_axis_tuple(destination, x.ndim, "destination")
    if len(source) != len(destination):
        raise NumpyInteropError("numpy.moveaxis: source and destination need as many axes")
    order = [n for n in range(x.ndim) if n not in source]
    for dest, src in sorted(zip(destination, source)):
        order.insert(dest, src)
    return F.transpose(x, tuple(order))


def _reshape(a, /, shape=None, order="C", *, newshape=None, copy=None):
    if order != "C":
        _refuse("numpy.reshape", "order", order, "deepx_flow reshapes in C order only")
    if shape is None:
        shape = newshape
    return F.reshape(as_tensor(a), shape)


def _ravel(a, order="C"):
    if order not in ("C", "K", "A"):
        _refuse("numpy.ravel", "order", order, "deepx_flow flattens in C order only")
    x = as_tensor(a)
    return F.reshape(x, (x.size,))


def _squeeze(a, axis=None):
    x = as_tensor(a)
    if axis is None:
        axes = tuple(i for i, n in enumerate(x.shape) if n == 1)
    else:
        axes = normalize_axis_tuple(axis, x.ndim)
        wide = [a for a in axes if x.shape[a] != 1]
        if wide:
            raise NumpyInteropError(f"numpy.squeeze: axis {wide[0]} has length "
                                    f"{x.shape[wide[0]]}, not 1", x.node.id)
    return F.reshape(x, tuple(n for i, n in enumerate(x.shape) if i not in axes))


def _expand_dims(a, axis):
    x = as_tensor(a)
    ndim = x.ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    axes = normalize_axis_tuple(axis, ndim)
    dims = iter(x.shape)
    return F.reshape(x, tuple(1 if i in axes else next(dims) for i in range(ndim)))


def _joined(fn, arrays, dtype, casting):
    if casting != "same_kind":
        _refuse(fn, "casting", casting, "leave it at NumPy's default")
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise NumpyInteropError(f"{fn} takes a non-empty sequence of arrays, got "
                                f"{shown(arrays)}")
    like = next((t for t in arrays if isinstance(t, Tensor)), None)
    tensors = [as_tensor(t, like) for t in arrays]
    if dtype is not None:
        tensors = [_as_dtype(t, dtype) for t in tensors]
    return tensors


def _concatenate(arrays, /, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _no("numpy.concatenate", out=out)
    tensors = _joined("numpy.concatenate", arrays, dtype, casting)
    if axis is None:
        tensors, axis = [F.reshape(t, (t.size,)) for t in tensors], 0
    return F.concat(tensors, axis)


def _stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _no("numpy.stack", out=out)
    tensors = _joined("numpy.stack", arrays, dtype, casting)
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors):
        raise NumpyInteropError(f"numpy.stack needs arrays of one shape, got "
                                f"{[t.shape for t in tensors]}")
    axis = normalize_axis_index(axis, len(shape) + 1)
    return F.concat([_expand_dims(t, axis) for t in tensors], axis)


def _where(condition, x=NO_VALUE, y=NO_VALUE):
    if x is NO_VALUE or y is NO_VALUE:
        raise NumpyInteropError("numpy.where with one argument gives the positions of the "
                                "true values, whose count is known only once it runs; "
                                "give np.where(condition, x, y)")
    return F.where(condition, x, y)


def _clip(a, a_min=NO_VALUE, a_max=NO_VALUE, out=None, *, min=NO_VALUE,  # noqa: A002
          max=NO_VALUE, **kwargs):  # noqa: A002
    _no("numpy.clip", out=out, **kwargs)
    lo = min if a_min is NO_VALUE else a_min
    hi = max if a_max is NO_VALUE else a_max
    return F.clip(a, None if lo is NO_VALUE else lo, None if hi is NO_VALUE else hi)


def _round(a, decimals=0, out=None):
    _no("numpy.round", out=out)
    if decimals != 0:
        _refuse("numpy.round", "decimals", decimals,
                f"round scaled values instead: np.round(x * 10**{decimals}) / 10**{decimals}"
                f" (or compute first)")
    return F.round(a)


def _index_operand(indices, like: Tensor) -> Tensor:
    if isinstance(indices, Tensor):
        return indices
    array = np.asarray(indices)
    return as_tensor(array if array.ndim else array[()], like)


def _take(a, indices, axis=None, out=None, mode="raise"):
    _no("numpy.take", out=out)
    if mode != "raise":
        _refuse("numpy.take", "mode", mode, "deepx_flow raises for an index out of range "
                "(NumPy's default); clip or wrap the indices first")
    x = as_tensor(a)
    if axis is None:
        x, axis = F.reshape(x, (x.size,)), 0
    return F.take(x, _index_operand(indices, x), axis)


def _take_along_axis(arr, indices, axis=-1):
    x = as_tensor(arr)
    if axis is None:
        raise NumpyInteropError("numpy.take_along_axis with axis=None: flatten first "
                                "(np.ravel(x)) and give axis=0")
    return F.take_along_axis(x, _index_operand(indices, x), axis)


def _pad(array, pad_width, mode="constant", **kwargs):
    value = kwargs.pop("constant_values", 0)
    if kwargs.pop("reflect_type", "even") != "even":
        _refuse("numpy.pad", "reflect_type", "odd", "only NumPy's default, 'even', is built")
    _no("numpy.pad", **kwargs)
    if mode not in F.PAD_MODES:
        _refuse("numpy.pad", "mode", mode, f"the modes built are {', '.join(F.PAD_MODES)}")
    if np.ndim(value) != 0:
        _refuse("numpy.pad", "constant_values", value, "one value for every side is built")
    return F.pad(as_tensor(array), pad_width, mode, value)


def _filled(fn, a, value, dtype, order, shape) -> Tensor:
    if order not in ("K", "C", "A"):
        _refuse(fn, "order", order, "deepx_flow tensors are in C order")
    x = as_tensor(a)
    dtype = dtypes.normalize(dtype) if dtype is not None else x.dtype
    if isinstance(value, (np.generic, np.ndarray)):
        value = np.asarray(value).item()
    return F.full(x.shape if shape is None else shape,
                  bool(value) if dtype == "bool" else value, dtype)


def _full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _filled("numpy.full_like", a, fill_value, dtype, order, shape)


def _zeros_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _filled("numpy.zeros_like", a, 0, dtype, order, shape)


def _ones_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    return _filled("numpy.ones_like", a, 1, dtype, order, shape)


def _astype(x, dtype, /, *, copy=True, device=None):
    return F.cast(as_tensor(x), dtype)


def _shape(a):
    return as_tensor(a).shape


def _ndim(a):
    return as_tensor(a).ndim


def _size(a, axis=None):
    x = as_tensor(a)
    return x.size if axis is None else x.shape[normalize_axis_index(axis, x.ndim)]


FUNCTIONS: dict[Callable, Callable] = {
    np.sum: _sum, np.mean: _mean, np.prod: _prod,
    np.max: _extreme("numpy.max", F.max), np.amax: _extreme("numpy.amax", F.max),
    np.min: _extreme("numpy.min", F.min), np.amin: _extreme("numpy.amin", F.min),
    np.argmax: _arg("numpy.argmax", F.argmax), np.argmin: _arg("numpy.argmin", F.argmin),
    np.cumsum: _cumsum, np.dot: _dot, np.transpose: _transpose, np.swapaxes: _swapaxes,
    np.flip: _flip,
    np.moveaxis: _moveaxis, np.reshape: _reshape, np.ravel: _ravel, np.squeeze: _squeeze,
    np.expand_dims: _expand_dims, np.concatenate: _concatenate, np.stack: _stack,
    np.where: _where, np.clip: _clip, np.round: _round, np.around: _round, np.take: _take,
    np.take_along_axis: _take_along_axis, np.pad: _pad,
    np.full_like: _full_like, np.zeros_like: _zeros_like, np.ones_like: _ones_like,
    np.shape: _shape, np.ndim: _ndim, np.size: _size,
}
# names NumPy 2 added (the array API's): there where this NumPy has them
for _module, _fn_name, _impl in ((np, "concat", _concatenate), (np, "permute_dims", _transpose),
                                 (np, "matrix_transpose", _matrix_transpose),
                                 (np, "astype", _astype), (np.linalg, "matmul", F.matmul),
                                 (np.linalg, "matrix_transpose", _matrix_transpose)):
    if hasattr(_module, _fn_name):
        FUNCTIONS[getattr(_module, _fn_name)] = _impl


def array_function(func, types, args: tuple, kwargs: dict):
    """`Tensor.__array_function__`: see the module docstring."""
    if not all(issubclass(t, (Tensor, np.ndarray)) for t in types):
        return NotImplemented  # another library's array too: NumPy asks it, then raises
    impl = FUNCTIONS.get(func)
    if impl is None:
        _no_operator(_name(func))
    return impl(*args, **kwargs)
