"""scikit-learn's operators: ONNX's `ai.onnx.ml` domain, as skl2onnx writes common pipelines.

Each converts to the graph's own operators, so a pipeline is chunked over its rows like any
model: scalers and imputers are elementwise, a linear model is a matmul, an encoder is a
lookup (`_lookup`), and a tree ensemble walks all its trees at once (`ml_trees.py`).
`SUPPORTED` names them with the domain in front (`ai.onnx.ml.Scaler`).

What comes out is what ONNX Runtime gives, which is what scikit-learn's converters are
tested against: scores and regressed values in float32, labels as int64. A classifier's
labels come from its raw scores, before the post-transform (`post_transform`: LOGISTIC,
SOFTMAX, SOFTMAX_ZERO, a regressor's PROBIT with ONNX Runtime's approximation of erfinv);
a binary classifier that scores one class writes
its two columns as ONNX Runtime does (`binary_scores`). A classifier's PROBIT is refused:
ONNX Runtime's output for it is not a probability of each class.

Refused by name: labels, keys and categories that are strings (deepx_flow has no string
tensors), and `ZipMap`, which makes a sequence of maps, not a tensor (`REFUSED`: convert
with skl2onnx's `options={"zipmap": False}`).
"""

from __future__ import annotations

import numpy as np

import deepx_flow as dx
from deepx_flow.onnx.values import Context, Value
from deepx_flow.onnx.registry import REFUSED, _c, _op, _t
from deepx_flow.sdk.tensor import Tensor

ML = "ai.onnx.ml."
REFUSED[ML + "ZipMap"] = (
    "ZipMap makes a sequence of maps (class label -> probability), not a tensor; convert "
    "the model with skl2onnx's options={'zipmap': False} to have the probabilities as a "
    "tensor")

# Lookups (`_lookup`): integer keys spanning at most this many values index a dense table;
# others compare each value with every key, for at most this many keys.
DENSE_SPAN = 1 << 20
COMPARED_KEYS = 4096


def _ml(name: str, family: str, doc: str, attrs=()):
    return _op(ML + name, family, doc, attrs)


def _floats(attrs: dict, name: str, default=None) -> np.ndarray | None:
    """A float attribute list (or its `_as_tensor` form) as a float32 array."""
    value = attrs.get(name)
    if value is None:
        value = attrs.get(name + "_as_tensor")
    if value is None:
        return None if default is None else np.asarray(default, np.float32)
    return np.asarray(value, dtype=np.float32).reshape(-1)


def _ints(attrs: dict, name: str) -> np.ndarray | None:
    value = attrs.get(name)
    return None if value is None else np.asarray(value, dtype=np.int64).reshape(-1)


def _no_strings(ctx: Context, attrs: dict, *names: str) -> None:
    for name in names:
        if len(attrs.get(name) or ()):
            raise ctx.error(f"{name} are strings, which deepx_flow has no tensors of; "
                            "encode the labels as integers before converting")


def _float32(ctx: Context, value: Value) -> Tensor:
    t = ctx.tensor(value)
    return t if t.dtype == "float32" else dx.cast(t, "float32")


def _working(ctx: Context, value: Value) -> Tensor:
    """An operand of a float32 result in the type it is computed in: float32 for float32
    and narrower floats, float64 for anything wider or integer (cast once at the end, as
    ONNX Runtime computes in the input's type: float32 would round 1e6 + 0.3 first)."""
    t = ctx.tensor(value)
    if t.dtype in ("float32", "float64"):
        return t
    return dx.cast(t, "float32" if t.dtype in ("float16", "bfloat16") else "float64")


def _rows(ctx: Context, value: Value) -> Tensor:
    """A classifier's or regressor's input as float32 rows (N, C): a vector is one row."""
    t = _float32(ctx, value)
    if t.ndim == 1:
        return dx.reshape(t, (1, t.shape[0]))
    if t.ndim != 2:
        raise ctx.error(f"takes rows of features (N, C), got shape {tuple(t.shape)}")
    return t


# -- post-transforms of scores ---------------------------------------------------------------
POST_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def post_transform(ctx: Context, scores: Tensor, kind: str, classifier: bool = False) -> Tensor:
    """Scores (N, K) through ONNX-ML's post-transform `kind`, as ONNX Runtime computes it."""
    if kind not in POST_TRANSFORMS:
        raise ctx.error(f"post_transform {kind!r} is not one of {', '.join(POST_TRANSFORMS)}")
    if classifier and kind == "PROBIT":
        raise ctx.error("post_transform PROBIT of a classifier is not supported (ONNX "
                        "Runtime's scores for it are not the classes' probabilities)")
    if kind == "NONE":
        return scores
    if kind == "LOGISTIC":
        return dx.sigmoid(scores)
    if kind == "SOFTMAX":
        return dx.softmax(scores, axis=-1)
    if kind == "SOFTMAX_ZERO":
        # a zero score stays (nearly) zero: exp(v - max) only where |v| > 1e-7; a row of
        # zeros is 0 / 0, NaN, as in ONNX Runtime
        top = dx.max(scores, axis=-1, keepdims=True)
        e = dx.where(dx.abs(scores) > 1e-7, dx.exp(scores - top), scores * dx.exp(-top))
        return e / dx.sum(e, axis=-1, keepdims=True)
    return dx.cast(_probit(scores), scores.dtype)


def binary_scores(scores: Tensor, kind: str, complement: bool) -> Tensor:
    """The two columns of a binary classifier that scores the second class alone (s, N x 1),
    as ONNX Runtime writes them: (1 - p, p) with p = sigmoid(s) under LOGISTIC; else, with
    SOFTMAX and SOFTMAX_ZERO not applied, (1 - s, s) where s is a probability already
    (`complement`) and (-s, s) where it is a signed margin."""
    if kind == "LOGISTIC":
        p = dx.sigmoid(scores)
        return dx.concat([1.0 - p, p], axis=1)
    return dx.concat([(1.0 - scores) if complement else -scores, scores], axis=1)


def _probit(p: Tensor) -> Tensor:
    """sqrt(2) erfinv(2p - 1) by ONNX Runtime's closed-form approximation of erfinv
    (Winitzki's, a = 0.147, with its pi of 3.14159)."""
    x = p * 2.0 - 1.0
    sign = dx.where(x < 0.0, -1.0, 1.0)
    log = dx.log((1.0 - x) * (1.0 + x))
    v = 2.0 / (3.14159 * 0.147) + 0.5 * log
    v3 = dx.sqrt(v * v - log * (1.0 / 0.147)) - v
    return 1.41421356 * sign * dx.sqrt(v3)


# -- elementwise transformers ----------------------------------------------------------------
@_ml("Binarizer", "scikit-learn", "1 where x > threshold, else 0, in x's type (NaN gives 0, "
     "as scikit-learn's)", attrs=("threshold",))
def _binarizer(ctx, node, args, attrs):
    x = ctx.tensor(args[0])
    threshold = float(attrs.get("threshold", 0.0))
    return _t(dx.cast(x > threshold, x.dtype))


@_ml("Scaler", "scikit-learn", "(x - offset) * scale per column, as float32",
     attrs=("offset", "scale"))
def _scaler(ctx, node, args, attrs):
    x = _working(ctx, args[0])
    offset, scale = _floats(attrs, "offset", [0.0]), _floats(attrs, "scale", [1.0])
    for name, values in (("offset", offset), ("scale", scale)):
        if values.size not in (1, x.shape[-1]):
            raise ctx.error(f"{name} has {values.size} values for {x.shape[-1]} columns")
    offset, scale = (ctx.tensor(Value(const=v.astype(x.dtype))) for v in (offset, scale))
    return _t(dx.cast((x - offset) * scale, "float32"))


@_ml("Normalizer", "scikit-learn", "each row divided by its MAX, L1 or L2 norm, as float32",
     attrs=("norm",))
def _normalizer(ctx, node, args, attrs):
    x = _working(ctx, args[0])
    norm = attrs.get("norm", "MAX")
    if norm == "MAX":
        size = dx.max(x, axis=-1, keepdims=True)
    elif norm == "L1":
        size = dx.sum(dx.abs(x), axis=-1, keepdims=True)
    elif norm == "L2":
        size = dx.sqrt(dx.sum(x * x, axis=-1, keepdims=True))
    else:
        raise ctx.error(f"norm {norm!r} is not one of MAX, L1, L2")
    return _t(dx.cast(dx.where(size == 0.0, x, x / dx.where(size == 0.0, 1.0, size)),
                      "float32"))


@_ml("Imputer", "scikit-learn", "the replaced value (NaN by default) by the column's "
     "imputed one", attrs=("imputed_value_floats", "imputed_value_int64s",
                           "replaced_value_float", "replaced_value_int64"))
def _imputer(ctx, node, args, attrs):
    x = ctx.tensor(args[0])
    if len(attrs.get("imputed_value_floats") or ()):
        values = np.asarray(attrs["imputed_value_floats"], np.float32)
        replaced = float(attrs.get("replaced_value_float", 0.0))
    elif len(attrs.get("imputed_value_int64s") or ()):
        values = np.asarray(attrs["imputed_value_int64s"], np.int64)
        replaced = int(attrs.get("replaced_value_int64", 0))
    else:
        raise ctx.error("has no imputed values")
    if values.size not in (1, x.shape[-1]):
        raise ctx.error(f"{values.size} imputed values for {x.shape[-1]} columns")
    missing = (x != x) if np.isnan(replaced) else (x == replaced)
    return _t(dx.where(missing, ctx.tensor(Value(const=values.astype(x.dtype))), x))


@_ml("ArrayFeatureExtractor", "scikit-learn", "the columns at the given indices (a vector "
     "gives one row)")
def _array_feature_extractor(ctx, node, args, attrs):
    data, indices = args
    if indices.const is not None:
        if (np.asarray(indices.const) < 0).any():
            raise ctx.error("negative indices are not supported (ONNX Runtime refuses them)")
        index = Value(const=np.asarray(indices.const, np.int64).reshape(-1))
    else:
        index = Value(tensor=dx.reshape(ctx.tensor(indices), (-1,)))
    count = index.shape[0]
    shape = (1, count) if len(data.shape) == 1 else tuple(data.shape[:-1]) + (count,)
    if data.const is not None and index.const is not None:
        return _c(np.take(data.const, index.const, axis=-1).reshape(shape))
    picked = dx.take(ctx.tensor(data), ctx.tensor(index), axis=len(data.shape) - 1)
    return _t(picked if tuple(picked.shape) == shape else dx.reshape(picked, shape))


# -- lookups ---------------------------------------------------------------------------------
def _lookup(ctx: Context, x: Tensor, keys: np.ndarray, values: np.ndarray, default,
            nan_matches: bool = False):
    """Each element of `x` replaced by the value of its key, or `default` where no key
    matches: a dense table indexed by `x - min(keys)` for integer keys of a short span,
    else a comparison with every key (a NaN key matches NaN where `nan_matches`)."""
    if keys.size == 0:
        return dx.full(tuple(x.shape), default, dtype=values.dtype.name)
    if keys.dtype.kind in "iu" and x.dtype[0] in "iu" and \
            int(keys.max()) - int(keys.min()) < DENSE_SPAN:
        low = int(keys.min())
        table = np.full(int(keys.max()) - low + 2, default, dtype=values.dtype)
        table[keys - low] = values
        offset = dx.cast(x, "int64") - low
        outside = (offset < 0) + (offset >= table.size - 1)  # bool + bool: or
        at = dx.where(outside, table.size - 1, offset)  # the last entry holds the default
        return dx.take(ctx.tensor(Value(const=table)), at)
    if keys.size > COMPARED_KEYS:
        raise ctx.error(f"{keys.size} keys of type {keys.dtype} (more than {COMPARED_KEYS} "
                        "that are not integers of a short span) are not supported")
    column = dx.reshape(x, tuple(x.shape) + (1,))
    keyed = ctx.tensor(Value(const=keys.reshape(-1)))
    hit = column == keyed
    if nan_matches and keys.dtype.kind == "f" and np.isnan(keys).any():
        hit = hit + (column != column) * (keyed != keyed)  # bool + and *: or and and
    found = dx.sum(dx.cast(hit, "int64"), axis=-1) > 0
    value = dx.sum(dx.where(hit, ctx.tensor(Value(const=values.reshape(-1))), 0),
                   axis=-1)
    return dx.where(found, dx.cast(value, values.dtype.name), default)


def _attribute_array(attrs: dict, stem: str) -> np.ndarray | None:
    """A LabelEncoder key or value list: `<stem>_int64s`, `<stem>_floats` or `<stem>_tensor`."""
    for suffix, dtype in (("_int64s", np.int64), ("_floats", np.float32)):
        if len(attrs.get(stem + suffix) or ()):
            return np.asarray(attrs[stem + suffix], dtype=dtype)
    if stem + "_tensor" in attrs:
        return np.asarray(attrs[stem + "_tensor"]).reshape(-1)
    return None


@_ml("LabelEncoder", "scikit-learn", "integer or float keys to integer or float values; a "
     "value with no key takes the default", attrs=(
         "keys_int64s", "keys_floats", "keys_strings", "keys_tensor", "values_int64s",
         "values_floats", "values_strings", "values_tensor", "default_int64", "default_float",
         "default_string", "default_tensor"))
def _label_encoder(ctx, node, args, attrs):
    _no_strings(ctx, attrs, "keys_strings", "values_strings")
    keys, values = _attribute_array(attrs, "keys"), _attribute_array(attrs, "values")
    if keys is None or values is None or keys.dtype.kind not in "iuf" or \
            values.dtype.kind not in "iuf":
        raise ctx.error("needs integer or float keys and values (strings are not supported)")
    if keys.size != values.size:
        raise ctx.error(f"{keys.size} keys but {values.size} values")
    if "default_tensor" in attrs:
        default = np.asarray(attrs["default_tensor"]).reshape(-1)[0]
    elif values.dtype.kind == "f":
        default = float(attrs.get("default_float", -0.0))
    else:
        default = int(attrs.get("default_int64", -1))
    # from ai.onnx.ml opset 4 keys compare bit for bit: a NaN key matches NaN
    nan_matches = ctx.opsets.get("ai.onnx.ml", 1) >= 4
    return _t(_lookup(ctx, ctx.tensor(args[0]), keys, values, values.dtype.type(default),
                      nan_matches))


@_ml("OneHotEncoder", "scikit-learn", "a one-hot row of float32 per value over cats_int64s; "
     "with zeros=0 a value not among them fails the run", attrs=(
         "cats_int64s", "cats_strings", "zeros"))
def _one_hot_encoder(ctx, node, args, attrs):
    _no_strings(ctx, attrs, "cats_strings")
    cats = _ints(attrs, "cats_int64s")
    if cats is None or cats.size == 0:
        raise ctx.error("has no categories")
    x = ctx.tensor(args[0])
    count = cats.size
    # the position of each value among the categories; an unknown one points past them: a
    # row of zeros where zeros=1, and an index out of range (the run fails) where zeros=0
    position = _lookup(ctx, x if x.dtype[0] in "iu" else dx.cast(x, "int64"), cats,
                       np.arange(count, dtype=np.int64), np.int64(count))
    rows = np.eye(count, dtype=np.float32)
    if int(attrs.get("zeros", 1)):
        rows = np.concatenate([rows, np.zeros((1, count), np.float32)])
    return _t(dx.take(ctx.tensor(Value(const=rows)), position, axis=0))


# -- linear models ---------------------------------------------------------------------------
def _linear_scores(ctx, x: Tensor, attrs: dict, targets: int) -> Tensor:
    coefficients = _floats(attrs, "coefficients")
    if coefficients is None or coefficients.size != targets * x.shape[1]:
        raise ctx.error(f"needs {targets} x {x.shape[1]} coefficients, got "
                        f"{0 if coefficients is None else coefficients.size}")
    weights = coefficients.reshape(targets, x.shape[1]).T.copy()
    scores = x @ ctx.tensor(Value(const=weights))
    intercepts = _floats(attrs, "intercepts")
    if intercepts is not None and intercepts.size:
        if intercepts.size not in (1, targets):
            raise ctx.error(f"{intercepts.size} intercepts for {targets} targets")
        scores = scores + ctx.tensor(Value(const=intercepts))
    return scores


@_ml("LinearRegressor", "scikit-learn", "x @ coefficients.T + intercepts (N, targets)",
     attrs=("coefficients", "intercepts", "targets", "post_transform"))
def _linear_regressor(ctx, node, args, attrs):
    x = _rows(ctx, args[0])
    scores = _linear_scores(ctx, x, attrs, int(attrs.get("targets", 1)))
    return _t(post_transform(ctx, scores, attrs.get("post_transform", "NONE")))


def _class_labels(ctx, attrs: dict, name: str = "classlabels_ints") -> np.ndarray:
    _no_strings(ctx, attrs, "classlabels_strings")
    labels = _ints(attrs, name)
    if labels is None or labels.size == 0:
        raise ctx.error(f"has no {name}")
    return labels


def labels_of(ctx, scores: Tensor, labels: np.ndarray) -> Tensor:
    """The label of each row's highest raw score (the first of ties), as int64."""
    return dx.take(ctx.tensor(Value(const=labels)), dx.argmax(scores, axis=1))


def label_above(ctx, score: Tensor, labels: np.ndarray, threshold: float) -> Tensor:
    """A binary classifier's label from its one raw score (N, 1): the second class above
    `threshold`, else the first."""
    return dx.where(dx.reshape(score, (score.shape[0],)) > threshold, int(labels[1]),
                    int(labels[0]))


@_ml("LinearClassifier", "scikit-learn", "scores x @ coefficients.T + intercepts; labels "
     "of the highest score", attrs=("coefficients", "intercepts", "classlabels_ints",
                                    "classlabels_strings", "multi_class", "post_transform"))
def _linear_classifier(ctx, node, args, attrs):
    labels = _class_labels(ctx, attrs)
    x = _rows(ctx, args[0])
    coefficients = _floats(attrs, "coefficients")
    targets = (coefficients.size if coefficients is not None else 0) // max(1, x.shape[1])
    raw = _linear_scores(ctx, x, attrs, targets)
    kind = attrs.get("post_transform", "NONE")
    post_transform(ctx, raw, kind, classifier=True)  # checks the kind
    if targets == 1:  # binary: one score, for the second class
        if labels.size != 2:
            raise ctx.error(f"one row of coefficients for {labels.size} class labels")
        return [Value(tensor=label_above(ctx, raw, labels, 0.0)),
                Value(tensor=binary_scores(raw, kind, complement=True))]
    return [Value(tensor=labels_of(ctx, raw, labels)),
            Value(tensor=post_transform(ctx, raw, kind, classifier=True))]
