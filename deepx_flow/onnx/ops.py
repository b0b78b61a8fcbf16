"""The ONNX operators deepx_flow converts, each to the graph's own operators.

`SUPPORTED` maps an ONNX op type to its converter and the attributes it reads; it is what
`load` checks a model against, what `deepx-flow onnx ops` lists and what the docs' table of
supported operators is generated from. A converter takes the conversion context, the ONNX
node, its input values (a `Value`: a tensor, or a constant known while building) and its
attributes, and returns its output values. The operator definitions followed are those of
opset 13 onwards; where an attribute became an input (the axes of Squeeze, Unsqueeze and the
reductions, Clip's bounds), both forms are read.

Constants: integer and bool computations on constants (shapes, axes, indices) are folded
with NumPy as the graph is built, exactly; so is arithmetic on small floating-point
constants (up to `SMALL_FLOAT` elements: Resize's scales computed from a Shape, as PyTorch
and Paddle export them), restricted to the operations IEEE rounds correctly, so that NumPy
gives the bits the kernels would. Any other floating-point constant becomes a named input
of the graph (`Context.tensor`), computed on like any tensor.

Where ONNX and NumPy's rules differ, ONNX's are kept: Div of integers truncates toward zero,
Pow's result has the base's type, integer reductions keep their type.
"""

from __future__ import annotations

import math

import numpy as np

import deepx_flow as dx
from deepx_flow.onnx.registry import _c, _const, _op, _t
from deepx_flow.onnx.values import Value, numpy_dtype
from deepx_flow.sdk.tensor import Tensor


def _exact(*values: Value | None) -> bool:
    """All given values are constants of integer or bool type: fold them with NumPy."""
    present = [v for v in values if v is not None]
    return bool(present) and all(v.const is not None and v.const.dtype.kind in "biu"
                                 for v in present)


# Float constants up to this many elements fold (scales, sizes and bounds computed from
# shapes); weights are larger, and stay inputs of the graph.
SMALL_FLOAT = 64


def _foldable(*values: Value | None) -> bool:
    """All given values are constants to compute with NumPy now: integers and bools
    (`_exact`), or floats of at most SMALL_FLOAT elements. Only for operations IEEE rounds
    correctly (+ - * /, sqrt, comparisons, selection, rounding, casts), whose NumPy results
    are the kernels' bit for bit."""
    present = [v for v in values if v is not None]
    return bool(present) and all(
        v.const is not None and (v.const.dtype.kind in "biu" or v.const.size <= SMALL_FLOAT)
        for v in present)


def _axes(ctx, node, args, attrs, position: int) -> list[int] | None:
    """Axes from the input at `position` (newer opsets) or the `axes` attribute."""
    if len(args) > position and args[position] is not None:
        return [int(a) for a in _const(ctx, args[position], "axes").reshape(-1)]
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    return None


def _norm(ctx, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


# -- elementwise ---------------------------------------------------------------------------
UNARY = {
    "Abs": (dx.abs, np.abs), "Neg": (dx.neg, np.negative), "Exp": (dx.exp, None),
    "Log": (dx.log, None), "Sqrt": (dx.sqrt, np.sqrt), "Tanh": (dx.tanh, None),
    "Sigmoid": (dx.sigmoid, None), "Relu": (dx.relu, lambda a: np.maximum(a, 0)),
    "Erf": (dx.erf, None), "Sin": (dx.sin, None), "Cos": (dx.cos, None),
    "Tan": (dx.tan, None), "Floor": (dx.floor, np.floor), "Ceil": (dx.ceil, np.ceil),
    "Round": (dx.round, np.rint), "Sign": (dx.sign, np.sign),
    "Reciprocal": (dx.reciprocal, None), "Softplus": (dx.softplus, None),
    "Sinh": (dx.sinh, None), "Cosh": (dx.cosh, None), "Asinh": (dx.asinh, None),
    "Acosh": (dx.acosh, None), "Atanh": (dx.atanh, None),
}


def _unary(fn, fold):
    def convert(ctx, node, args, attrs):
        (x,) = args
        if fold is not None and _foldable(x):
            with np.errstate(all="ignore"):
                return _c(fold(x.const))
        return _t(fn(ctx.tensor(x)))
    return convert


for _name, (_fn, _fold) in UNARY.items():
    _op(_name, "elementwise", f"dx.{_fn.__name__}")(_unary(_fn, _fold))


@_op("Identity", "elementwise", "the value itself")
def _identity(ctx, node, args, attrs):
    return [args[0]]


COMPARE = {"Equal": ("__eq__", np.equal), "Less": ("__lt__", np.less),
           "LessOrEqual": ("__le__", np.less_equal), "Greater": ("__gt__", np.greater),
           "GreaterOrEqual": ("__ge__", np.greater_equal)}
ARITH = {"Add": ("__add__", np.add), "Sub": ("__sub__", np.subtract),
         "Mul": ("__mul__", np.multiply)}


def _binary(method, fold):
    def convert(ctx, node, args, attrs):
        a, b = args
        if _foldable(a, b):
            with np.errstate(all="ignore"):
                return _c(fold(a.const, b.const))
        return _t(getattr(ctx.tensor(a), method)(ctx.tensor(b)))
    return convert


for _name, (_method, _fold) in {**COMPARE, **ARITH}.items():
    _op(_name, "elementwise", "NumPy broadcasting")(_binary(_method, _fold))


@_op("Div", "elementwise", "true division; integers truncate toward zero, as ONNX defines")
def _div(ctx, node, args, attrs):
    a, b = args
    if a.dtype[0] in "iu" or a.dtype == "bool":
        if _exact(a, b):
            with np.errstate(all="ignore"):
                return _c(np.trunc(a.const / b.const).astype(a.dtype))
        if np.dtype(a.dtype).itemsize > 4:
            raise ctx.error(f"integer division of {a.dtype} is not supported (it goes through "
                            "float64, exact only below 2**53)")
        quotient = dx.cast(ctx.tensor(a), "float64") / dx.cast(ctx.tensor(b), "float64")
        return _t(dx.cast(quotient, a.dtype))  # the cast truncates toward zero
    if _foldable(a, b):
        with np.errstate(all="ignore"):
            return _c(np.true_divide(a.const, b.const))
    return _t(ctx.tensor(a) / ctx.tensor(b))


@_op("Pow", "elementwise", "the result has the base's type")
def _pow(ctx, node, args, attrs):
    a, b = args
    base = ctx.tensor(a)
    if a.dtype[0] == "f":
        return _t(dx.pow(base, dx.cast(ctx.tensor(b), a.dtype)))
    if b.dtype[0] in "iu":
        if _exact(a, b):
            return _c(np.power(a.const, b.const.astype(a.dtype)))
        return _t(dx.pow(base, dx.cast(ctx.tensor(b), a.dtype)))
    return _t(dx.cast(dx.pow(dx.cast(base, "float64"), dx.cast(ctx.tensor(b), "float64")),
                      a.dtype))


def _logical(fold, build):
    def convert(ctx, node, args, attrs):
        if any(v.dtype != "bool" for v in args):
            raise ctx.error("takes bool operands")
        if _exact(*args):
            return _c(fold(*(v.const for v in args)))
        return _t(build(*(ctx.tensor(v) for v in args)))
    return convert


_op("And", "elementwise", "bool")(_logical(np.logical_and, lambda a, b: a * b))
_op("Or", "elementwise", "bool")(_logical(np.logical_or, lambda a, b: a + b))
_op("Xor", "elementwise", "bool")(_logical(np.logical_xor, lambda a, b: a != b))
_op("Not", "elementwise", "bool")(_logical(np.logical_not, lambda a: a == False))  # noqa: E712


def _variadic(name, fold, pair):
    def convert(ctx, node, args, attrs):
        if fold is not None and _foldable(*args):
            out = args[0].const
            for v in args[1:]:
                out = fold(out, v.const)
            return _c(out)
        out = ctx.tensor(args[0])
        for v in args[1:]:
            out = pair(out, ctx.tensor(v))
        if name == "Mean":
            out = out / float(len(args))
        return _t(out)
    return convert


_op("Max", "elementwise", "NaN propagates")(_variadic("Max", np.maximum, dx.maximum))
_op("Min", "elementwise", "NaN propagates")(_variadic("Min", np.minimum, dx.minimum))
_op("Sum", "elementwise", "")(_variadic("Sum", np.add, lambda a, b: a + b))
_op("Mean", "elementwise", "")(_variadic("Mean", None, lambda a, b: a + b))


@_op("Where", "elementwise", "")
def _where(ctx, node, args, attrs):
    cond, a, b = args
    if _foldable(cond, a, b):
        return _c(np.where(cond.const, a.const, b.const))
    return _t(dx.where(ctx.tensor(cond), ctx.tensor(a), ctx.tensor(b)))


@_op("Cast", "elementwise", "to a supported type", attrs=("to", "saturate"))
def _cast(ctx, node, args, attrs):
    dtype = numpy_dtype(attrs["to"], ctx.where()).name
    return _cast_to(ctx, args[0], dtype)


@_op("CastLike", "elementwise", "to the second input's type", attrs=("saturate",))
def _cast_like(ctx, node, args, attrs):
    return _cast_to(ctx, args[0], args[1].dtype)


def _cast_to(ctx, x: Value, dtype: str) -> list[Value]:
    if _foldable(x) and (np.dtype(dtype).kind in "biu" or x.const.size <= SMALL_FLOAT):
        with np.errstate(all="ignore"):
            return _c(x.const.astype(dtype))
    return _t(dx.cast(ctx.tensor(x), dtype))


@_op("Clip", "elementwise", "bounds as inputs (opset 11+)")
def _clip(ctx, node, args, attrs):
    x = args[0]
    lo = args[1] if len(args) > 1 else None
    hi = args[2] if len(args) > 2 else None
    if lo is None and hi is None:
        return [x]
    return _t(dx.clip(ctx.tensor(x), None if lo is None else ctx.tensor(lo),
                      None if hi is None else ctx.tensor(hi)))


@_op("LeakyRelu", "elementwise", "dx.nn.leaky_relu", attrs=("alpha",))
def _leaky_relu(ctx, node, args, attrs):
    return _t(dx.nn.leaky_relu(ctx.tensor(args[0]), float(attrs.get("alpha", 0.01))))


@_op("Gelu", "elementwise", "exact (erf) or tanh approximation", attrs=("approximate",))
def _gelu(ctx, node, args, attrs):
    mode = attrs.get("approximate", "none")
    if mode not in ("none", "tanh"):
        raise ctx.error(f"approximate={mode!r} is not one of 'none', 'tanh'")
    return _t(dx.nn.gelu(ctx.tensor(args[0]), approximate=mode == "tanh"))


def _activation(fn, *names_defaults):
    """An activation of dx.nn whose float attributes (with ONNX's defaults) pass on as
    keywords of the same names."""
    def convert(ctx, node, args, attrs):
        kwargs = {name: float(attrs.get(name, default)) for name, default in names_defaults}
        return _t(fn(ctx.tensor(args[0]), **kwargs))
    return convert


for _name, _fn, _defaults in [
        ("Elu", dx.nn.elu, (("alpha", 1.0),)),
        ("Selu", dx.nn.selu, (("alpha", dx.nn.activations.SELU_ALPHA),
                              ("gamma", dx.nn.activations.SELU_GAMMA))),
        ("Celu", dx.nn.celu, (("alpha", 1.0),)),
        ("ThresholdedRelu", dx.nn.thresholded_relu, (("alpha", 1.0),)),
        ("HardSigmoid", dx.nn.hard_sigmoid, (("alpha", 0.2), ("beta", 0.5))),
        ("HardSwish", dx.nn.hard_swish, ()),
        ("Mish", dx.nn.mish, ())]:
    _op(_name, "elementwise", f"dx.nn.{_fn.__name__}",
        attrs=tuple(n for n, _ in _defaults))(_activation(_fn, *_defaults))


@_op("PRelu", "elementwise", "dx.nn.prelu (the slope broadcasts to the input)")
def _prelu(ctx, node, args, attrs):
    return _t(dx.nn.prelu(ctx.tensor(args[0]), ctx.tensor(args[1])))


# -- matrix products -----------------------------------------------------------------------
@_op("MatMul", "matmul", "NumPy's matmul, batched and broadcast")
def _matmul(ctx, node, args, attrs):
    return _t(dx.matmul(ctx.tensor(args[0]), ctx.tensor(args[1])))


@_op("Gemm", "matmul", "alpha A' B' + beta C", attrs=("alpha", "beta", "transA", "transB"))
def _gemm(ctx, node, args, attrs):
    a, b = ctx.tensor(args[0]), ctx.tensor(args[1])
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    y = a @ b
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    if len(args) > 2 and args[2] is not None and beta != 0.0:
        c = ctx.tensor(args[2])
        y = y + (c * beta if beta != 1.0 else c)
    return _t(y)


@_op("Softmax", "softmax", "along one axis (opset 13)", attrs=("axis",))
def _softmax(ctx, node, args, attrs):
    return _t(dx.softmax(ctx.tensor(args[0]), int(attrs.get("axis", -1))))


@_op("LogSoftmax", "softmax", "along one axis (opset 13)", attrs=("axis",))
def _log_softmax(ctx, node, args, attrs):
    return _t(dx.log_softmax(ctx.tensor(args[0]), int(attrs.get("axis", -1))))


# -- layout --------------------------------------------------------------------------------
def _reshaped(ctx, x: Value, shape: tuple) -> list[Value]:
    if x.const is not None:
        return _c(x.const.reshape(shape))
    return _t(dx.reshape(ctx.tensor(x), shape))


@_op("Reshape", "layout", "0 copies a dimension (unless allowzero), -1 is inferred",
     attrs=("allowzero",))
def _reshape(ctx, node, args, attrs):
    x, spec = args[0], [int(s) for s in _const(ctx, args[1], "the shape")]
    allowzero = bool(attrs.get("allowzero", 0))
    if not allowzero and any(s == 0 and i >= len(x.shape) for i, s in enumerate(spec)):
        raise ctx.error(f"shape {spec} copies a dimension (0) beyond the input's rank "
                        f"{len(x.shape)}")
    shape = [x.shape[i] if s == 0 and not allowzero else s for i, s in enumerate(spec)]
    if shape.count(-1) > 1:
        raise ctx.error(f"shape {spec} has more than one -1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        total = math.prod(x.shape)
        if known == 0 or total % known:
            raise ctx.error(f"cannot reshape {x.shape} to {spec}")
        shape[shape.index(-1)] = total // known
    if math.prod(shape) != math.prod(x.shape):
        raise ctx.error(f"cannot reshape {x.shape} to {spec}")
    return _reshaped(ctx, x, tuple(shape))


@_op("Flatten", "layout", "to 2-D at an axis", attrs=("axis",))
def _flatten(ctx, node, args, attrs):
    x = args[0]
    rank = len(x.shape)
    axis = int(attrs.get("axis", 1))
    if not -rank <= axis <= rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    if axis < 0:
        axis += rank
    return _reshaped(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@_op("Squeeze", "layout", "drops axes of size 1", attrs=("axes",))
def _squeeze(ctx, node, args, attrs):
    x = args[0]
    axes = _axes(ctx, node, args, attrs, 1)
    rank = len(x.shape)
    drop = {i for i, s in enumerate(x.shape) if s == 1} if axes is None else \
        {_norm(ctx, a, rank) for a in axes}
    if any(x.shape[a] != 1 for a in drop):
        raise ctx.error(f"cannot squeeze axes {sorted(drop)} of shape {x.shape}")
    return _reshaped(ctx, x, tuple(s for i, s in enumerate(x.shape) if i not in drop))


@_op("Unsqueeze", "layout", "inserts axes of size 1", attrs=("axes",))
def _unsqueeze(ctx, node, args, attrs):
    x = args[0]
    axes = _axes(ctx, node, args, attrs, 1)
    if axes is None:
        raise ctx.error("needs axes")
    rank = len(x.shape) + len(axes)
    new = sorted(_norm(ctx, a, rank) for a in axes)
    if len(set(new)) != len(new):
        raise ctx.error(f"axes {axes} repeat an axis")
    dims = iter(x.shape)
    return _reshaped(ctx, x, tuple(1 if i in new else next(dims) for i in range(rank)))


@_op("Transpose", "layout", "", attrs=("perm",))
def _transpose(ctx, node, args, attrs):
    x = args[0]
    perm = attrs.get("perm")
    if x.const is not None:
        return _c(np.transpose(x.const, perm))
    return _t(dx.transpose(ctx.tensor(x), None if perm is None else tuple(perm)))


@_op("Concat", "layout", "", attrs=("axis",))
def _concat(ctx, node, args, attrs):
    axis = int(attrs["axis"])
    if all(v.const is not None for v in args):
        return _c(np.concatenate([v.const for v in args], axis=axis))
    return _t(dx.concat([ctx.tensor(v) for v in args], axis=axis))


@_op("Expand", "layout", "broadcast to a shape (both ways, as NumPy)")
def _expand(ctx, node, args, attrs):
    x = args[0]
    shape = tuple(int(s) for s in _const(ctx, args[1], "the shape"))
    try:
        out = np.broadcast_shapes(x.shape, shape)
    except ValueError:
        raise ctx.error(f"cannot broadcast {x.shape} to {shape}") from None
    if x.const is not None:
        return _c(np.broadcast_to(x.const, out).copy())
    everywhere = dx.full(out, True, dtype="bool")
    tensor = ctx.tensor(x)
    return _t(dx.where(everywhere, tensor, tensor))  # the exact bits, not x + 0


@_op("Gather", "gather", "np.take along an axis", attrs=("axis",))
def _gather(ctx, node, args, attrs):
    x, indices = args
    axis = _norm(ctx, int(attrs.get("axis", 0)), len(x.shape))
    if x.const is not None and indices.const is not None:
        return _c(np.take(x.const, indices.const, axis=axis))
    return _t(dx.take(ctx.tensor(x), ctx.tensor(indices), axis=axis))


@_op("Slice", "layout", "positive steps")
def _slice(ctx, node, args, attrs):
    x = args[0]
    starts = _const(ctx, args[1], "starts")
    ends = _const(ctx, args[2], "ends")
    rank = len(x.shape)
    axes = _const(ctx, args[3], "axes") if len(args) > 3 and args[3] is not None else \
        np.arange(len(starts))
    steps = _const(ctx, args[4], "steps") if len(args) > 4 and args[4] is not None else \
        np.ones(len(starts), np.int64)
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[_norm(ctx, int(axis), rank)] = slice(int(start), int(end), int(step))
    if x.const is not None:
        return _c(x.const[tuple(index)])
    return _t(ctx.tensor(x)[tuple(index)])


# -- shapes and constants ------------------------------------------------------------------
@_op("Shape", "constant", "folded: shapes are static", attrs=("start", "end"))
def _shape(ctx, node, args, attrs):
    shape = args[0].shape
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return _c(np.array(shape[start:end], dtype=np.int64))


@_op("Size", "constant", "folded")
def _size(ctx, node, args, attrs):
    return _c(np.array(math.prod(args[0].shape), dtype=np.int64))


@_op("Constant", "constant", "", attrs=("value", "value_float", "value_floats", "value_int",
                                         "value_ints"))
def _constant(ctx, node, args, attrs):
    (name, value), = attrs.items()
    if name == "value":
        numpy_dtype_of(ctx, value)
        return _c(value)
    dtype = np.float32 if "float" in name else np.int64
    return _c(np.array(value, dtype=dtype))


def numpy_dtype_of(ctx, array: np.ndarray) -> None:
    from deepx_flow.ir import dtypes
    if array.dtype.name not in dtypes.DTYPES:
        raise ctx.error(f"data type {array.dtype} is not supported")


@_op("ConstantOfShape", "constant", "", attrs=("value",))
def _constant_of_shape(ctx, node, args, attrs):
    shape = tuple(int(s) for s in _const(ctx, args[0], "the shape"))
    value = attrs.get("value", np.zeros(1, np.float32)).reshape(-1)
    numpy_dtype_of(ctx, value)
    if value.dtype.kind in "biu":
        return _c(np.full(shape, value[0], dtype=value.dtype))
    return _t(dx.full(shape, value[0].item(), dtype=value.dtype.name))


@_op("Range", "constant", "")
def _range(ctx, node, args, attrs):
    start, limit, delta = (_const(ctx, v, name) for v, name in
                           zip(args, ("start", "limit", "delta")))
    if _exact(*args):
        return _c(np.arange(start, limit, delta, dtype=start.dtype))
    n = max(0, math.ceil((float(limit) - float(start)) / float(delta)))
    index = dx.arange(n, dtype=start.dtype.name)
    return _t(index * dx.full((), delta.item(), dtype=start.dtype.name) +
              dx.full((), start.item(), dtype=start.dtype.name))


# -- reductions ----------------------------------------------------------------------------
def _reduce(kind: str):
    def convert(ctx, node, args, attrs):
        x = args[0]
        axes = _axes(ctx, node, args, attrs, 1)
        keep = bool(attrs.get("keepdims", 1))
        rank = len(x.shape)
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(rank))
        axes = tuple(sorted({_norm(ctx, a, rank) for a in axes}))
        t = ctx.tensor(x)
        if kind in ("sum", "mean", "prod", "max", "min"):
            out = getattr(dx, kind)(t, axis=axes, keepdims=keep)
        elif kind == "sum_square":
            out = dx.sum(t * t, axis=axes, keepdims=keep)
        elif kind == "l1":
            out = dx.sum(dx.abs(t), axis=axes, keepdims=keep)
        elif kind == "l2":
            out = dx.sqrt(dx.sum(t * t, axis=axes, keepdims=keep))
        elif kind == "log_sum":
            out = dx.log(dx.sum(t, axis=axes, keepdims=keep))
        else:  # log_sum_exp
            out = dx.log(dx.sum(dx.exp(t), axis=axes, keepdims=keep))
        return _t(out if out.dtype == x.dtype else dx.cast(out, x.dtype))
    return convert


for _name, _kind in {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceProd": "prod",
                     "ReduceMax": "max",
                     "ReduceMin": "min", "ReduceSumSquare": "sum_square", "ReduceL1": "l1",
                     "ReduceL2": "l2", "ReduceLogSum": "log_sum",
                     "ReduceLogSumExp": "log_sum_exp"}.items():
    _op(_name, "reduction", "over constant axes; keeps the input's type",
        attrs=("axes", "keepdims", "noop_with_empty_axes"))(_reduce(_kind))


def _arg(kind: str):
    def convert(ctx, node, args, attrs):
        x = ctx.tensor(args[0])
        axis = _norm(ctx, int(attrs.get("axis", 0)), x.ndim)
        keep = bool(attrs.get("keepdims", 1))
        if not attrs.get("select_last_index", 0):
            return _t(getattr(dx, kind)(x, axis=axis, keepdims=keep))
        # the last index holding the extreme (the last NaN where there is one)
        extreme = (dx.max if kind == "argmax" else dx.min)(x, axis=axis, keepdims=True)
        n = x.shape[axis]
        index = dx.reshape(dx.arange(n, dtype="int64"),
                           tuple(n if a == axis else 1 for a in range(x.ndim)))
        hit = x == extreme
        if x.dtype[0] == "f":
            hit = dx.where(x != x, True, hit)
        return _t(dx.max(dx.where(hit, index, -1), axis=axis, keepdims=keep))
    return convert


_op("ArgMax", "reduction", "the first (or last) index of the largest value",
    attrs=("axis", "keepdims", "select_last_index"))(_arg("argmax"))
_op("ArgMin", "reduction", "the first (or last) index of the smallest value",
    attrs=("axis", "keepdims", "select_last_index"))(_arg("argmin"))


# -- convolution and pooling ---------------------------------------------------------------
def _window_pads(ctx, attrs, x_shape, kernel, strides, dilations) -> tuple[int, ...]:
    """Explicit pads from `pads` or `auto_pad` (SAME_UPPER / SAME_LOWER: the output is
    ceil(size / stride) long, the odd pad at the end / the beginning)."""
    n = len(kernel)
    mode = attrs.get("auto_pad", "NOTSET")
    if mode in ("NOTSET", ""):
        return tuple(attrs.get("pads", (0,) * (2 * n)))
    if mode == "VALID":
        return (0,) * (2 * n)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad {mode!r} is not one of NOTSET, VALID, SAME_UPPER, "
                        "SAME_LOWER")
    begins, ends = [], []
    for a in range(n):
        size = x_shape[2 + a]
        out = -(-size // strides[a])
        total = max(0, (out - 1) * strides[a] + dilations[a] * (kernel[a] - 1) + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return tuple(begins + ends)


def _ceil_pads(x_shape, kernel, strides, pads, dilations) -> tuple[int, ...]:
    """`pads` with the end pads grown so that floor division gives ceil mode's output size
    (the last window starting inside the input or its begin padding, as ONNX's reference)."""
    n = len(kernel)
    ends = list(pads[n:])
    for a in range(n):
        span = x_shape[2 + a] + pads[a] + pads[n + a] - dilations[a] * (kernel[a] - 1) - 1
        out = -(-span // strides[a]) + 1
        if (out - 1) * strides[a] >= x_shape[2 + a] + pads[a]:
            out -= 1
        ends[a] += max(0, (out - 1) * strides[a] - span)
    return tuple(pads[:n]) + tuple(ends)


def _kernel(ctx, attrs, w) -> tuple[int, ...]:
    """The weights' kernel shape, which `kernel_shape` (optional) must repeat."""
    kernel = tuple(w.shape[2:])
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != kernel:
        raise ctx.error(f"kernel_shape {attrs['kernel_shape']} differs from the weights' "
                        f"{kernel}")
    return kernel


def _window_settings(ctx, attrs, x_shape, kernel):
    n = len(kernel)
    strides = tuple(attrs.get("strides", (1,) * n))
    dilations = tuple(attrs.get("dilations", (1,) * n))
    pads = _window_pads(ctx, attrs, x_shape, kernel, strides, dilations)
    return strides, pads, dilations


@_op("Conv", "convolution", "1-D to 3-D, NC...; bias, groups, dilations, auto_pad",
     attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(ctx, node, args, attrs):
    x, w = ctx.tensor(args[0]), ctx.tensor(args[1])
    kernel = _kernel(ctx, attrs, w)
    strides, pads, dilations = _window_settings(ctx, attrs, x.shape, kernel)
    b = ctx.tensor(args[2]) if len(args) > 2 and args[2] is not None else None
    return _t(dx.nn.conv(x, w, b, stride=strides, padding=pads, dilation=dilations,
                         groups=int(attrs.get("group", 1))))


def _pool_convert(op: str):
    def convert(ctx, node, args, attrs):
        if len(node.output) > 1 and node.output[1]:
            raise ctx.error("the Indices output is not supported")
        x = ctx.tensor(args[0])
        kernel = tuple(attrs["kernel_shape"])
        strides, pads, dilations = _window_settings(ctx, attrs, x.shape, kernel)
        include = bool(attrs.get("count_include_pad", 0))
        if attrs.get("ceil_mode", 0):
            if include:
                raise ctx.error("ceil_mode with count_include_pad is not supported")
            pads = _ceil_pads(x.shape, kernel, strides, pads, dilations)
        if op == "max_pool":
            return _t(dx.nn.max_pool(x, kernel, strides, pads, dilations))
        if any(d != 1 for d in dilations):
            raise ctx.error("dilated average pooling is not supported")
        return _t(dx.nn.avg_pool(x, kernel, strides, pads, count_include_pad=include))
    return convert


_op("MaxPool", "pooling", "NaN propagates; padding never wins; ceil_mode",
    attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order",
           "strides"))(_pool_convert("max_pool"))
_op("AveragePool", "pooling", "padding counted only with count_include_pad; ceil_mode",
    attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
           "strides"))(_pool_convert("avg_pool"))


@_op("GlobalAveragePool", "pooling", "the mean over the spatial axes")
def _global_avg(ctx, node, args, attrs):
    return _t(dx.nn.global_avg_pool(ctx.tensor(args[0])))


@_op("GlobalMaxPool", "pooling", "the largest value over the spatial axes")
def _global_max(ctx, node, args, attrs):
    return _t(dx.nn.global_max_pool(ctx.tensor(args[0])))


# -- normalization -------------------------------------------------------------------------
@_op("BatchNormalization", "normalization", "inference, or training_mode's batch statistics",
     attrs=("epsilon", "momentum", "training_mode"))
def _batch_norm(ctx, node, args, attrs):
    x, scale, bias, mean, var = (ctx.tensor(v) for v in args[:5])
    eps = float(attrs.get("epsilon", 1e-5))
    if not attrs.get("training_mode", 0):
        if len(node.output) > 1 and any(node.output[1:]):
            raise ctx.error("the running statistics are outputs only with training_mode=1")
        return _t(dx.nn.batch_norm(x, scale, bias, mean, var, eps))
    momentum = float(attrs.get("momentum", 0.9))
    batch_mean, batch_var = dx.nn.batch_norm_stats(x)
    y = dx.nn.batch_norm(x, scale, bias, batch_mean, batch_var, eps)
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    return [Value(tensor=y), Value(tensor=running_mean), Value(tensor=running_var)]


@_op("LayerNormalization", "normalization", "over the axes from axis on; Mean and "
     "InvStdDev outputs", attrs=("axis", "epsilon", "stash_type"))
def _layer_norm(ctx, node, args, attrs):
    x = ctx.tensor(args[0])
    _stash(ctx, attrs)
    axis = _norm(ctx, int(attrs.get("axis", -1)), x.ndim)
    eps = float(attrs.get("epsilon", 1e-5))
    scale = ctx.tensor(args[1])
    out_dtype = x.dtype
    if x.dtype == "float16":  # statistics in float32 (stash_type 1)
        x = dx.cast(x, "float32")
    bias = ctx.tensor(args[2]) if len(args) > 2 and args[2] is not None else None
    axes = tuple(range(axis, x.ndim))
    mean = dx.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    inv_std = 1.0 / dx.sqrt(dx.mean(centered * centered, axis=axes, keepdims=True) + eps)
    y = dx.cast(centered * inv_std, out_dtype) * scale
    if bias is not None:
        y = y + bias
    return [Value(tensor=y), Value(tensor=mean), Value(tensor=inv_std)]


def _stash(ctx, attrs) -> None:
    if int(attrs.get("stash_type", 1)) != 1:
        raise ctx.error(f"stash_type {attrs['stash_type']} is not supported (statistics are "
                        "float32 or wider, stash_type 1)")


@_op("InstanceNormalization", "normalization", "per image and channel", attrs=("epsilon",))
def _instance_norm(ctx, node, args, attrs):
    x, scale, bias = (ctx.tensor(v) for v in args)
    return _t(dx.nn.instance_norm(x, scale, bias, float(attrs.get("epsilon", 1e-5))))


@_op("GroupNormalization", "normalization", "scale and bias per channel (opset 21)",
     attrs=("epsilon", "num_groups", "stash_type"))
def _group_norm(ctx, node, args, attrs):
    x, scale, bias = (ctx.tensor(v) for v in args)
    _stash(ctx, attrs)
    if scale.shape != (x.shape[1],):
        raise ctx.error(f"scale of shape {scale.shape} is per group (opset 18); opset 21's "
                        "is per channel")
    return _t(dx.nn.group_norm(x, int(attrs["num_groups"]), scale, bias,
                               float(attrs.get("epsilon", 1e-5))))


# -- padding -------------------------------------------------------------------------------
@_op("Pad", "layout", "constant, edge, reflect, wrap; negative pads crop", attrs=("mode",))
def _pad(ctx, node, args, attrs):
    x = args[0]
    rank = len(x.shape)
    pads = [int(p) for p in _const(ctx, args[1], "pads")]
    value = 0
    if len(args) > 2 and args[2] is not None:
        value = _const(ctx, args[2], "the constant value").reshape(-1)
        value = value[0].item() if value.size else 0
    axes = [_norm(ctx, int(a), rank) for a in _const(ctx, args[3], "axes")] \
        if len(args) > 3 and args[3] is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads has {len(pads)} values for {len(axes)} axes")
    mode = attrs.get("mode", "constant")
    widths = [[0, 0] for _ in range(rank)]
    crop = [slice(None)] * rank
    for i, axis in enumerate(axes):
        begin, end = pads[i], pads[len(axes) + i]
        widths[axis] = [max(begin, 0), max(end, 0)]
        crop[axis] = slice(max(-begin, 0), x.shape[axis] - max(-end, 0))
    t = ctx.tensor(x)
    if any(s != slice(None) for s in crop):
        t = t[tuple(crop)]
    if mode == "constant" and t.dtype[0] in "iub":
        value = int(value) if t.dtype != "bool" else bool(value)
    try:
        return _t(dx.pad(t, [tuple(w) for w in widths], mode=mode, value=value))
    except dx.GraphError as err:
        raise ctx.error(str(err)) from None


# -- cumulative sums -----------------------------------------------------------------------
@_op("CumSum", "cumulative", "exclusive, reverse; a scan (dx.cumsum), in the input's type",
     attrs=("exclusive", "reverse"))
def _cumsum(ctx, node, args, attrs):
    """ONNX keeps the input's type where NumPy widens small integers: the int64 sums cast
    back wrap exactly as sums in that type do."""
    x = ctx.tensor(args[0])
    axis = _norm(ctx, int(_const(ctx, args[1], "axis").reshape(-1)[0]), x.ndim)
    flags = {}
    for name in ("exclusive", "reverse"):
        value = attrs.get(name, 0)
        if value not in (0, 1):
            raise ctx.error(f"{name} must be 0 or 1, got {value}")
        flags[name] = bool(value)
    y = dx.cumsum(x, axis, **flags)
    return _t(y if y.dtype == x.dtype else dx.cast(y, x.dtype))


@_op("ConvTranspose", "convolution", "output_shape, output_padding, auto_pad, groups",
     attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape",
            "pads", "strides"))
def _conv_transpose(ctx, node, args, attrs):
    x, w = ctx.tensor(args[0]), ctx.tensor(args[1])
    kernel = _kernel(ctx, attrs, w)
    n = len(kernel)
    strides = tuple(attrs.get("strides", (1,) * n))
    dilations = tuple(attrs.get("dilations", (1,) * n))
    extra = list(attrs.get("output_padding", (0,) * n))
    mode = attrs.get("auto_pad", "NOTSET")
    full = [strides[a] * (x.shape[2 + a] - 1) + extra[a] + dilations[a] * (kernel[a] - 1) + 1
            for a in range(n)]
    target = attrs.get("output_shape")
    if target is not None and len(target) > n:
        target = target[-n:]
    if mode in ("SAME_UPPER", "SAME_LOWER") and target is None:
        target = [x.shape[2 + a] * strides[a] for a in range(n)]
    if target is not None:  # pads that give this output size
        begins, ends = [], []
        for a in range(n):
            total = full[a] - int(target[a])
            if total < 0:  # larger than the full output: the rest is output padding
                extra[a] -= total
                total = 0
            half = total // 2  # SAME_UPPER puts the odd one at the end, else at the start
            upper = mode == "SAME_UPPER"
            begins.append(half if upper else total - half)
            ends.append(total - half if upper else half)
        pads = tuple(begins + ends)
    elif mode == "VALID" or mode in ("NOTSET", ""):
        pads = tuple(attrs.get("pads", (0,) * (2 * n))) if mode != "VALID" else (0,) * (2 * n)
    else:
        raise ctx.error(f"auto_pad {mode!r} is not one of NOTSET, VALID, SAME_UPPER, "
                        "SAME_LOWER")
    b = ctx.tensor(args[2]) if len(args) > 2 and args[2] is not None else None
    return _t(dx.nn.conv_transpose(x, w, b, stride=strides, padding=pads, dilation=dilations,
                                   groups=int(attrs.get("group", 1)), output_padding=tuple(extra)))


# -- resizing ------------------------------------------------------------------------------
@_op("Resize", "resize", "nearest, linear, cubic; every transformation mode but "
     "tf_crop_and_resize; antialias; exclude_outside; keep_aspect_ratio_policy",
     attrs=("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
            "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
            "nearest_mode"))
def _resize(ctx, node, args, attrs):
    from deepx_flow.onnx import resize
    x = args[0]
    rank = len(x.shape)
    mode = attrs.get("mode", "nearest")
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.error(f"mode {mode!r} is not one of nearest, linear, cubic")
    if transform not in resize.TRANSFORMS:
        raise ctx.error(f"coordinate_transformation_mode {transform!r} is not supported "
                        f"(supported: {', '.join(resize.TRANSFORMS)})")
    if nearest_mode not in resize.NEAREST_MODES:
        raise ctx.error(f"nearest_mode {nearest_mode!r} is not one of "
                        f"{', '.join(resize.NEAREST_MODES)}")
    if mode != "nearest" and x.dtype[0] != "f":
        raise ctx.error(f"{mode} resizing of {x.dtype} is not supported (floats only)")
    axes = [_norm(ctx, a, rank) for a in attrs.get("axes", range(rank))]
    scales = args[2] if len(args) > 2 and args[2] is not None else None
    sizes = args[3] if len(args) > 3 and args[3] is not None else None
    if scales is not None and _const(ctx, scales, "scales").size == 0:
        scales = None
    if (scales is None) == (sizes is None):
        raise ctx.error("needs either scales or sizes")
    in_sizes = [x.shape[a] for a in axes]
    if sizes is not None:
        out = [int(s) for s in _const(ctx, sizes, "sizes")]
        factors = [o / i for o, i in zip(out, in_sizes)]
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise ctx.error(f"keep_aspect_ratio_policy {policy!r} is not one of "
                                "stretch, not_larger, not_smaller")
            one = min(factors) if policy == "not_larger" else max(factors)
            factors = [one] * len(axes)
            out = [int(one * i + 0.5) for i in in_sizes]
    else:
        factors = [float(f) for f in _const(ctx, scales, "scales")]
        out = [int(f * i) for f, i in zip(factors, in_sizes)]
    if len(factors) != len(axes):
        raise ctx.error(f"{len(factors)} scales or sizes for {len(axes)} axes")
    t = ctx.tensor(x)
    exact = mode == "nearest"
    work = t if exact else dx.cast(t, "float64")
    for axis, factor, length in zip(axes, factors, out):
        if math.isclose(factor, 1.0) and length == work.shape[axis]:
            continue
        index, weights = resize.taps(
            mode, work.shape[axis], length, factor, transform, nearest_mode=nearest_mode,
            cubic_a=float(attrs.get("cubic_coeff_a", -0.75)),
            antialias=bool(attrs.get("antialias", 0)),
            exclude_outside=bool(attrs.get("exclude_outside", 0)))
        if exact:  # one tap carries the weight 1
            chosen = index[np.arange(length), weights.argmax(axis=1)]
            work = dx.take(work, ctx.tensor(Value(const=chosen)), axis=axis)
            continue
        shape = (length,) + (1,) * (rank - axis - 1)
        total = None
        for k in range(index.shape[1]):
            picked = dx.take(work, ctx.tensor(Value(const=np.ascontiguousarray(index[:, k]))),
                             axis=axis)
            term = picked * dx.reshape(ctx.tensor(Value(const=weights[:, k].copy())), shape)
            total = term if total is None else total + term
        work = total
    return _t(work if exact else dx.cast(work, x.dtype))


# -- gathers by computed positions ---------------------------------------------------------
def _positions(ctx, index: Tensor, n: int) -> Tensor:
    """Indices made non-negative (ONNX counts negative ones from the end), as int64."""
    index = dx.cast(index, "int64") if index.dtype != "int64" else index
    return dx.where(index < 0, index + n, index)


def _grid(shape: tuple, axis: int) -> Tensor:
    """The coordinate along `axis` of every position of `shape`, broadcastable to it."""
    return dx.reshape(dx.arange(shape[axis], dtype="int64"),
                      tuple(s if a == axis else 1 for a, s in enumerate(shape)))


@_op("GatherElements", "gather", "np.take_along_axis (an index out of range fails the run)",
     attrs=("axis",))
def _gather_elements(ctx, node, args, attrs):
    x, index = ctx.tensor(args[0]), ctx.tensor(args[1])
    axis = _norm(ctx, int(attrs.get("axis", 0)), x.ndim)
    return _t(dx.take_along_axis(x, index, axis=axis))


@_op("GatherND", "gather", "dx.gather_nd, batch axes as leading index columns (an index "
     "out of range fails the run)", attrs=("batch_dims",))
def _gather_nd(ctx, node, args, attrs):
    x, index = ctx.tensor(args[0]), ctx.tensor(args[1])
    b = int(attrs.get("batch_dims", 0))
    k = index.shape[-1] if index.ndim else 0
    if k < 1 or b + k > x.ndim or index.shape[:b] != x.shape[:b]:
        raise ctx.error(f"indices {index.shape} do not address data {x.shape} with "
                        f"batch_dims {b}")
    if b:
        # each row of indices gets its batch position as leading columns: a gather_nd
        # without batch axes, which checks every index against its own axis
        lead = index.shape[:-1]
        columns = [dx.reshape(_grid(lead, a) + dx.zeros(lead, "int64"), lead + (1,))
                   for a in range(b)]
        index = dx.concat(columns + [index.astype("int64")], axis=index.ndim - 1)
    return _t(dx.gather_nd(x, index))


# -- scatters ------------------------------------------------------------------------------
# (The deprecated Scatter is ScatterElements of opset 10 and older, which `load` refuses:
# onnx.version_converter turns it into ScatterElements.)
def _reduction(ctx, attrs) -> str:
    reduction = attrs.get("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ctx.error(f"reduction {reduction!r} is not one of none, add, mul, max, min")
    return reduction


def _folded(ctx, op: str, args, **attrs) -> list[Value]:
    """A scatter of integer or bool constants (a shape being edited), computed now with the
    operator's own type rule and kernel."""
    from deepx_flow.compiler.infer import new_node
    from deepx_flow.errors import ExecutionError
    from deepx_flow.ir import Node
    from deepx_flow.kernels import scatter
    arrays = [v.const for v in args]
    operands = [Node(f"const{i}", "input", (), a.shape, a.dtype.name)
                for i, a in enumerate(arrays)]
    new_node(op, operands, **attrs)  # the type rule: a GraphError names what is wrong
    try:
        return _c(scatter.KERNELS[op](*arrays, **attrs))
    except ExecutionError as err:
        raise ctx.error(str(err)) from None


@_op("ScatterElements", "scatter", "reduction none, add, mul, max, min; a repeated index "
     "with none: the last update in C order wins", attrs=("axis", "reduction"))
def _scatter_elements(ctx, node, args, attrs):
    x, index, updates = args
    axis = _norm(ctx, int(attrs.get("axis", 0)), len(x.shape))
    reduction = _reduction(ctx, attrs)
    if _exact(x, index, updates):
        return _folded(ctx, "scatter_elements", args, axis=axis, reduction=reduction)
    return _t(dx.scatter(ctx.tensor(x), ctx.tensor(index), ctx.tensor(updates), axis=axis,
                         reduction=reduction))


@_op("ScatterND", "scatter", "reduction none, add, mul, max, min; a repeated index row "
     "with none: the last one in C order wins", attrs=("reduction",))
def _scatter_nd(ctx, node, args, attrs):
    x, index, updates = args
    reduction = _reduction(ctx, attrs)
    if _exact(x, index, updates):
        return _folded(ctx, "scatter_nd", args, reduction=reduction)
    return _t(dx.scatter_nd(ctx.tensor(x), ctx.tensor(index), ctx.tensor(updates),
                            reduction=reduction))
