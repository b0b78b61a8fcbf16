"""Losses and the operations training needs, composed of the graph's operators.

Everything here builds ordinary nodes (so it is chunked, fused and differentiated like any
other computation) and is a pure function of its arguments: no hidden state, and every random
value depends only on (seed, step, element index).

Labels are checked where a wrong one would otherwise pass silently: a class label outside
`0..classes-1` makes its sample's cross-entropy NaN (not a loss of 0), which `dx.train`
reports as an error at that step.
"""

from __future__ import annotations

from deepx_flow.errors import GraphError, shown
from deepx_flow.ir import dtypes
from deepx_flow.sdk import functions as F
from deepx_flow.sdk import random
from deepx_flow.sdk.tensor import Tensor, as_tensor

REDUCTIONS = ("mean", "sum", "none")


def one_hot(labels, classes: int, dtype="float32") -> Tensor:
    """`labels` (integers) as one-hot vectors along a new last axis of length `classes`.

    A label outside `0..classes-1` gives a row of zeros, as in JAX; `cross_entropy` turns
    such a row into a NaN loss instead.
    """
    labels = as_tensor(labels)
    if labels.dtype == "bool" or dtypes.is_float(labels.dtype):
        raise GraphError(f"one_hot takes integer labels, got {labels.dtype}", labels.node.id)
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
        raise GraphError(f"one_hot: classes must be a positive integer, got {shown(classes)}")
    column = F.reshape(labels, labels.shape + (1,))
    return F.cast(column == F.arange(classes, dtype="int64"), dtype)


def cross_entropy(logits, labels, reduction: str = "mean", axis: int = -1) -> Tensor:
    """Softmax cross-entropy of `logits` against `labels`.

    Parameters
    ----------
    logits : Tensor
        Unnormalized scores, floating point, classes along `axis` (the last by default).
    labels : Tensor
        Integer class indices of `logits`' shape without the class axis, or probabilities
        (one-hot or soft) of `logits`' shape.
    reduction : {"mean", "sum", "none"}
        Mean or sum over the samples, or one loss per sample.
    axis : int
        The class axis of `logits`.
    """
    logits, labels = as_tensor(logits), as_tensor(labels)
    _check_reduction(reduction)
    if not dtypes.is_float(logits.dtype):
        raise GraphError(f"cross_entropy: logits must be floating point, got {logits.dtype}",
                         logits.node.id)
    axis = F._axis("cross_entropy", logits, axis)
    log_p = F.log_softmax(logits, axis=axis)
    classes = logits.shape[axis]
    if dtypes.is_float(labels.dtype):
        if labels.shape != logits.shape:
            raise GraphError(f"cross_entropy: probability labels must have the logits' shape "
                             f"{logits.shape}, got {labels.shape}", labels.node.id)
        weights = labels.astype(logits.dtype)
        per_sample = -F.where(weights == 0, 0.0, weights * log_p).sum(axis=axis)
    else:
        expected = logits.shape[:axis] + logits.shape[axis + 1:]
        if labels.shape != expected:
            raise GraphError(f"cross_entropy: class labels must have shape {expected} (the "
                             f"logits' {logits.shape} without the class axis), got "
                             f"{labels.shape}", labels.node.id)
        hot = one_hot(labels, classes, logits.dtype)
        if axis != logits.ndim - 1:
            order = list(range(logits.ndim - 1))
            order.insert(axis, logits.ndim - 1)
            hot = F.transpose(hot, order)
        # Only the label's log-probability is read (a masked class's -inf times 0 would be
        # NaN). A label out of range has no 1 in its row: 0 / 0 makes its loss NaN, never 0.
        picked = F.where(hot > 0, log_p, 0.0)
        per_sample = -picked.sum(axis=axis) / hot.sum(axis=axis)
    return _reduce(per_sample, reduction)


def mse(predictions, targets, reduction: str = "mean") -> Tensor:
    """Mean squared error: the mean (or sum, or each) of `(predictions - targets) ** 2`."""
    predictions, targets = as_tensor(predictions), as_tensor(targets)
    _check_reduction(reduction)
    if predictions.shape != targets.shape:
        raise GraphError(f"mse: predictions {predictions.shape} and targets {targets.shape} "
                         "differ in shape (broadcasting them is usually a mistake)",
                         predictions.node.id)
    diff = predictions - targets
    return _reduce(diff * diff, reduction)


def dropout(x, rate: float, seed: int, step: int | None) -> Tensor:
    """Zero each element with probability `rate` and scale the rest by `1 / (1 - rate)`;
    with `step=None` (inference, evaluation), `x` itself.

    The mask depends only on (seed, step, element index): the same step drops the same
    elements on any chunk grid and any number of workers, and each step draws anew. A loss
    given to `dx.train` that takes a `step` argument gets each training step's number, and
    `step=None` when it is evaluated.
    """
    x = as_tensor(x)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate < 1:
        raise GraphError(f"dropout: rate must be in [0, 1), got {shown(rate)}", x.node.id)
    if rate == 0 or step is None:
        return x
    if not dtypes.is_float(x.dtype):
        raise GraphError(f"dropout applies to floating-point tensors, got {x.dtype}",
                         x.node.id)
    draw = random.uniform(x.shape, seed=random.derive_seed(seed, step), dtype="float32")
    return F.where(draw >= rate, x * (1.0 / (1.0 - rate)), 0.0)


def _check_reduction(reduction: str) -> None:
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise GraphError(f"reduction must be one of {', '.join(REDUCTIONS)}, got "
                         f"{shown(reduction)}")


def _reduce(values: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return values
    return values.mean() if reduction == "mean" else values.sum()
