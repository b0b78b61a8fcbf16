"""Support vector machines of ONNX's `ai.onnx.ml` domain: SVMRegressor and SVMClassifier, as
skl2onnx writes scikit-learn's SVR, SVC and their linear forms.

The kernel between the rows and the support vectors is one matrix product (N, vectors):
linear `x . v`, poly `(gamma x . v + coef0) ** degree`, sigmoid `tanh(gamma x . v + coef0)`,
rbf `exp(-gamma |x - v|^2)` with `|x - v|^2 = |x|^2 + |v|^2 - 2 x . v`; it is computed in
float64 (the expansion cancels where a row is near a support vector) and the scores are
rounded to float32, as ONNX Runtime gives them.

A classifier with support vectors votes one-against-one, as libsvm: the decision of each
pair of classes (i, j) is a column of `kernel @ pair_weights + rho`, a vote for i where it
is positive, else for j; the label is the class with the most votes (the first of ties),
and the scores are the pairs' decisions (a binary one's written as ONNX Runtime writes it,
`ml_ops.binary_scores`). Probability estimates (`prob_a`, `prob_b`: libsvm's
iterative pairwise coupling) are refused by name: train the SVC with probability=False.
"""

from __future__ import annotations

import numpy as np

import deepx_flow as dx
from deepx_flow.onnx.ml_ops import (_class_labels, _floats, _ints, _ml, _rows, binary_scores,
                                    labels_of, post_transform)
from deepx_flow.onnx.values import Context, Value
from deepx_flow.onnx.registry import _t
from deepx_flow.sdk.tensor import Tensor

KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")
SVM_ATTRS = ("coefficients", "kernel_params", "kernel_type", "post_transform", "rho",
             "support_vectors")


def _kernel(ctx: Context, x: Tensor, vectors: np.ndarray, attrs: dict) -> Tensor:
    """The kernel of every row with every support vector, float64 (N, vectors)."""
    kind = attrs.get("kernel_type", "LINEAR")
    if kind not in KERNELS:
        raise ctx.error(f"kernel_type {kind!r} is not one of {', '.join(KERNELS)}")
    params = list(attrs.get("kernel_params") or []) + [0.0, 0.0, 0.0]
    gamma, coef0, degree = float(params[0]), float(params[1]), int(params[2])
    wide = dx.cast(x, "float64")
    v = vectors.astype(np.float64)
    dot = wide @ ctx.tensor(Value(const=np.ascontiguousarray(v.T)))
    if kind == "LINEAR":
        return dot
    if kind == "POLY":
        return (dot * gamma + coef0) ** float(degree)
    if kind == "SIGMOID":
        return dx.tanh(dot * gamma + coef0)
    squares = dx.sum(wide * wide, axis=1, keepdims=True) + \
        ctx.tensor(Value(const=(v * v).sum(axis=1)))
    return dx.exp(dx.maximum(squares - 2.0 * dot, 0.0) * -gamma)


def _coefficients(ctx, attrs: dict) -> np.ndarray:
    coefficients = _floats(attrs, "coefficients")
    if coefficients is None or coefficients.size == 0:
        raise ctx.error("has no coefficients")
    return coefficients.astype(np.float64)


def _support_vectors(ctx, attrs: dict, count: int, features: int) -> np.ndarray:
    vectors = _floats(attrs, "support_vectors")
    if vectors is None or vectors.size != count * features:
        raise ctx.error(f"needs {count} support vectors of {features} features")
    return vectors.reshape(count, features)


@_ml("SVMRegressor", "scikit-learn", "sum of coefficient x kernel with the support vectors, "
     "plus rho (one_class: the sign)", attrs=SVM_ATTRS + ("n_supports", "one_class"))
def _svm_regressor(ctx, node, args, attrs):
    x = _rows(ctx, args[0])
    count = int(attrs.get("n_supports", 0))
    coefficients = _coefficients(ctx, attrs)
    rho = float(_floats(attrs, "rho", [0.0])[0])
    terms = count if count > 0 else x.shape[1]
    if coefficients.size != terms:
        raise ctx.error(f"needs {terms} coefficients, got {coefficients.size}")
    weights = coefficients.reshape(terms, 1)
    if count > 0:
        kernel = _kernel(ctx, x, _support_vectors(ctx, attrs, count, x.shape[1]), attrs)
    else:  # liblinear: the coefficients are the weights of the features
        kernel = dx.cast(x, "float64")
    score = kernel @ ctx.tensor(Value(const=weights)) + rho
    if int(attrs.get("one_class", 0)):
        score = dx.where(score > 0.0, 1.0, -1.0)
    return _t(post_transform(ctx, dx.cast(score, "float32"), attrs.get("post_transform",
                                                                          "NONE")))


@_ml("SVMClassifier", "scikit-learn", "one-against-one votes of the pairs' decisions "
     "(linear, poly, rbf, sigmoid kernels); no probability estimates",
     attrs=SVM_ATTRS + ("classlabels_ints", "classlabels_strings", "prob_a", "prob_b",
                        "vectors_per_class"))
def _svm_classifier(ctx, node, args, attrs):
    labels = _class_labels(ctx, attrs)
    if len(attrs.get("prob_a") or ()):
        raise ctx.error("probability estimates (prob_a, prob_b: libsvm's iterative pairwise "
                        "coupling) are not supported; train the SVC with probability=False")
    x = _rows(ctx, args[0])
    classes = labels.size
    per_class = _ints(attrs, "vectors_per_class")
    coefficients = _coefficients(ctx, attrs)
    rho = _floats(attrs, "rho", [0.0]).astype(np.float64)
    kind = attrs.get("post_transform", "NONE")
    post_transform(ctx, x, kind, classifier=True)  # checks the kind
    if per_class is None or per_class.sum() == 0:  # liblinear: one score per class
        if coefficients.size != classes * x.shape[1]:
            raise ctx.error(f"needs {classes} x {x.shape[1]} coefficients, got "
                            f"{coefficients.size}")
        weights = coefficients.reshape(classes, x.shape[1]).T.copy()
        raw = dx.cast(dx.cast(x, "float64") @ ctx.tensor(Value(const=weights)) +
                      float(rho[0]), "float32")
        return [Value(tensor=labels_of(ctx, raw, labels)),
                Value(tensor=post_transform(ctx, raw, kind, classifier=True))]
    count = int(per_class.sum())
    kernel = _kernel(ctx, x, _support_vectors(ctx, attrs, count, x.shape[1]), attrs)
    if coefficients.size != (classes - 1) * count:
        raise ctx.error(f"needs {classes - 1} x {count} coefficients, got {coefficients.size}")
    coefs = coefficients.reshape(-1, count)
    starts = np.concatenate([[0], np.cumsum(per_class)[:-1]])
    pairs = [(i, j) for i in range(classes) for j in range(i + 1, classes)]
    if rho.size != len(pairs):
        raise ctx.error(f"{rho.size} rho values for {len(pairs)} pairs of classes")
    pair_weights = np.zeros((count, len(pairs)))
    winner_if_positive = np.zeros((len(pairs), classes))
    winner_otherwise = np.zeros((len(pairs), classes))
    for e, (i, j) in enumerate(pairs):
        si, sj = slice(starts[i], starts[i] + per_class[i]), slice(starts[j],
                                                                   starts[j] + per_class[j])
        pair_weights[si, e] = coefs[j - 1, si]
        pair_weights[sj, e] = coefs[i, sj]
        winner_if_positive[e, i] = winner_otherwise[e, j] = 1.0
    decisions = kernel @ ctx.tensor(Value(const=pair_weights)) + \
        ctx.tensor(Value(const=rho))
    positive = dx.cast(decisions > 0.0, "float64")
    votes = positive @ ctx.tensor(Value(const=winner_if_positive)) + \
        (1.0 - positive) @ ctx.tensor(Value(const=winner_otherwise))
    label = labels_of(ctx, votes, labels)
    scores = dx.cast(decisions, "float32")
    if len(pairs) == 1:  # binary: the decision s, written as ONNX Runtime writes it: (-s, s)
        # with no post-transform, (1 - s, s) under SOFTMAX and SOFTMAX_ZERO (not applied)
        return [Value(tensor=label),
                Value(tensor=binary_scores(scores, kind, complement=kind != "NONE"))]
    return [Value(tensor=label),
            Value(tensor=post_transform(ctx, scores, kind, classifier=True))]
