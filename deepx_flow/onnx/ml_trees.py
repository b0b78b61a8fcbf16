"""Tree ensembles of ONNX's `ai.onnx.ml` domain: TreeEnsembleClassifier, TreeEnsembleRegressor
(what skl2onnx writes for random forests and gradient boosting) and TreeEnsemble (ai.onnx.ml
opset 5).

Every tree is walked at once, a level at a time: a tensor holds, for each row and tree, the
index of the node it has reached (N, T). Each level gathers the nodes' features, thresholds
and children from constant tables and reads the rows' feature values (`take_along_axis`), so
the walk is as many short steps as the deepest tree is deep, chunked over the rows like any
tensor. A leaf is its own child both ways, so a row that reaches one early stays there. The
leaves' weights are a table (node, target); a gather gives (N, T, targets), which the
ensemble's aggregate function reduces over the trees.

The comparisons follow ONNX: BRANCH_LEQ, LT, GTE, GT, EQ, NEQ and (TreeEnsemble) MEMBER, in
the input's type against thresholds in theirs; a missing value (NaN) takes the true branch
where `missing_value_tracks_true` says so, else the false one. Scores come out as ONNX
Runtime gives them: float32, base values added after the aggregation, then the
post-transform; a binary classifier with weights for one class only scores (1 - s, s), or
(-s, s) before a post-transform other than PROBIT.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import deepx_flow as dx
from deepx_flow.onnx.ml_ops import (_class_labels, _floats, _ints, _ml, _rows, binary_scores,
                                    label_above, labels_of, post_transform)
from deepx_flow.onnx.values import Context, Value
from deepx_flow.onnx.registry import _t
from deepx_flow.sdk.tensor import Tensor

MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
         "BRANCH_MEMBER", "LEAF")
LEAF = MODES.index("LEAF")
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")  # TreeEnsemble's enum order
POST = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")  # TreeEnsemble's enum order


@dataclass
class Forest:
    """Trees as flat tables over one index space of their nodes (and leaves)."""

    feature: np.ndarray     # int64, per node (0 for a leaf)
    threshold: np.ndarray   # per node
    mode: np.ndarray        # index into MODES
    true: np.ndarray        # int64: the node a true comparison leads to (a leaf: itself)
    false: np.ndarray
    missing_true: np.ndarray  # bool
    members: list           # per node, the set of values of a BRANCH_MEMBER, else None
    roots: np.ndarray       # int64, per tree
    weights: np.ndarray     # float32 (node, target)
    weighted: np.ndarray    # bool (node, target): the leaf votes for that target
    depth: int              # the most comparisons from a root to a leaf
    tracks_missing: bool = False  # nodes_missing_value_tracks_true was given


def _depth(forest_true, forest_false, mode, roots, where) -> int:
    """The longest path of comparisons (checked to be a tree: no node visited twice)."""
    deepest = 0
    for root in roots.tolist():
        stack, seen = [(root, 0)], set()
        while stack:
            node, depth = stack.pop()
            if node in seen:
                raise where(f"tree node {node} is reached twice (a cycle or a shared node)")
            seen.add(node)
            if mode[node] == LEAF:
                deepest = max(deepest, depth)
            else:
                stack += [(int(forest_true[node]), depth + 1),
                          (int(forest_false[node]), depth + 1)]
    return deepest


def _classic_forest(ctx: Context, attrs: dict, prefix: str, targets: int) -> Forest:
    """The tables of a TreeEnsembleClassifier (`prefix` "class") or Regressor ("target")."""
    tree_ids, node_ids = _ints(attrs, "nodes_treeids"), _ints(attrs, "nodes_nodeids")
    if tree_ids is None or node_ids is None or tree_ids.size != node_ids.size:
        raise ctx.error("needs nodes_treeids and nodes_nodeids of one length")
    n = tree_ids.size
    index = {(t, i): k for k, (t, i) in enumerate(zip(tree_ids.tolist(), node_ids.tolist()))}
    modes = [m.decode() if isinstance(m, bytes) else m for m in attrs.get("nodes_modes", [])]
    unknown = sorted(set(modes) - set(MODES) - {"BRANCH_MEMBER"})
    if len(modes) != n or unknown:
        raise ctx.error(f"nodes_modes must give one of {', '.join(MODES[:6] + MODES[7:])} "
                        f"per node, got {unknown or len(modes)}")
    mode = np.array([MODES.index(m) for m in modes], np.int64)
    if (mode == MODES.index("BRANCH_MEMBER")).any():
        raise ctx.error("BRANCH_MEMBER is not defined for TreeEnsembleClassifier/Regressor")
    feature = np.where(mode == LEAF, 0, _ints(attrs, "nodes_featureids"))
    threshold = _floats(attrs, "nodes_values")
    if "nodes_values_as_tensor" in attrs:
        threshold = np.asarray(attrs["nodes_values_as_tensor"]).reshape(-1)
    true, false = np.arange(n), np.arange(n)
    for kind, column in (("true", true), ("false", false)):
        ids = _ints(attrs, f"nodes_{kind}nodeids")
        for k in np.flatnonzero(mode != LEAF):
            target = index.get((int(tree_ids[k]), int(ids[k])))
            if target is None:
                raise ctx.error(f"tree {tree_ids[k]} node {node_ids[k]} leads to node "
                                f"{ids[k]}, which the tree does not have")
            column[k] = target
    missing = _ints(attrs, "nodes_missing_value_tracks_true")
    missing_true = np.zeros(n, bool) if missing is None or missing.size == 0 else missing > 0
    trees = sorted(set(tree_ids.tolist()))
    roots = np.array([index.get((t, 0), int(np.flatnonzero(tree_ids == t)[0])) for t in trees],
                     np.int64)
    vote_trees, vote_nodes = _ints(attrs, f"{prefix}_treeids"), _ints(attrs, f"{prefix}_nodeids")
    vote_ids, vote_weights = _ints(attrs, f"{prefix}_ids"), _floats(attrs, f"{prefix}_weights")
    if f"{prefix}_weights_as_tensor" in attrs:  # double weights stay double
        vote_weights = np.asarray(attrs[f"{prefix}_weights_as_tensor"]).reshape(-1)
    if vote_trees is None or vote_weights is None or not (
            vote_trees.size == vote_nodes.size == vote_ids.size == vote_weights.size):
        raise ctx.error(f"needs {prefix}_treeids, _nodeids, _ids and _weights of one length")
    weights = np.zeros((n, targets), np.result_type(vote_weights.dtype, np.float32))
    weighted = np.zeros((n, targets), bool)
    for t, i, target, w in zip(vote_trees.tolist(), vote_nodes.tolist(), vote_ids.tolist(),
                               vote_weights.tolist()):
        k = index.get((t, i))
        if k is None or not 0 <= target < targets:
            raise ctx.error(f"a vote for tree {t} node {i}, {prefix} {target}, names no leaf "
                            f"or target of the ensemble")
        weights[k, target] += w
        weighted[k, target] = True
    depth = _depth(true, false, mode, roots, ctx.error)
    return Forest(feature.astype(np.int64), threshold, mode, true.astype(np.int64),
                  false.astype(np.int64), missing_true, [None] * n, roots, weights, weighted,
                  depth, tracks_missing=missing is not None and missing.size > 0)


def _leaf_nodes(forest_x: Tensor, forest: Forest, ctx: Context) -> Tensor:
    """The leaf each row reaches in each tree: int64 (N, T)."""
    const = lambda array: ctx.tensor(Value(const=np.ascontiguousarray(array)))  # noqa: E731
    rows = forest_x.shape[0]
    node = dx.take(const(forest.roots), dx.full((rows, 1), 0, dtype="int64") +
                   const(np.arange(forest.roots.size)))
    branch_modes = sorted(set(forest.mode[forest.mode != LEAF].tolist()))
    work = forest_x.dtype
    thresholds = forest.threshold.astype(work)
    for _ in range(forest.depth):
        value = dx.take_along_axis(forest_x, dx.take(const(forest.feature), node), axis=1)
        threshold = dx.take(const(thresholds), node)
        go = None
        for m in branch_modes:
            passes = _compare(MODES[m], value, threshold, forest, node, ctx)
            go = passes if go is None else dx.where(dx.take(const(forest.mode), node) == m,
                                                    passes, go)
        if forest.tracks_missing:  # NaN goes where the node says; else it compares (false,
            # but true for BRANCH_NEQ), as in ONNX Runtime
            go = dx.where(value != value, dx.take(const(forest.missing_true), node), go)
        node = dx.where(go, dx.take(const(forest.true), node),
                        dx.take(const(forest.false), node))
    return node


def _compare(mode: str, value, threshold, forest: Forest, node, ctx) -> Tensor:
    if mode == "BRANCH_LEQ":
        return value <= threshold
    if mode == "BRANCH_LT":
        return value < threshold
    if mode == "BRANCH_GTE":
        return value >= threshold
    if mode == "BRANCH_GT":
        return value > threshold
    if mode == "BRANCH_EQ":
        return value == threshold
    if mode == "BRANCH_NEQ":
        return value != threshold
    # BRANCH_MEMBER: the value equals one of the node's set (a table of the sets, padded
    # with NaN, which equals nothing)
    width = max(len(s) for s in forest.members if s is not None)
    table = np.full((len(forest.members), width), np.nan, dtype=value.dtype)
    for k, s in enumerate(forest.members):
        if s is not None:
            table[k, :len(s)] = sorted(s)
    sets = dx.take(ctx.tensor(Value(const=table)), node, axis=0)  # (N, T, width)
    hits = dx.reshape(value, tuple(value.shape) + (1,)) == sets
    return dx.sum(dx.cast(hits, "int64"), axis=-1) > 0


def _aggregate(ctx, forest: Forest, leaves: Tensor, kind: str, base) -> Tensor:
    """The leaves' votes (N, T, targets) reduced over the trees, plus the base values."""
    votes = dx.take(ctx.tensor(Value(const=forest.weights)), leaves, axis=0)
    trees = forest.roots.size
    if kind in ("SUM", "AVERAGE"):
        out = dx.sum(votes, axis=1)
        if kind == "AVERAGE":
            out = out / float(trees)
    elif kind in ("MIN", "MAX"):
        voted = dx.take(ctx.tensor(Value(const=forest.weighted)), leaves, axis=0)
        fill = forest.weights.dtype.type(np.inf if kind == "MIN" else -np.inf)
        reduce = dx.min if kind == "MIN" else dx.max
        out = reduce(dx.where(voted, votes, fill), axis=1)
        out = dx.where(dx.abs(out) == np.inf, 0.0, out)  # no tree voted for the target
    else:
        raise ctx.error(f"aggregate_function {kind!r} is not one of {', '.join(AGGREGATES)}")
    if base is not None and base.size:
        out = out + ctx.tensor(Value(const=np.asarray(base, forest.weights.dtype)))
    return out


def _features(ctx, value: Value) -> Tensor:
    x = ctx.tensor(value)
    if x.dtype not in ("float32", "float64"):
        x = dx.cast(x, "float32")
    return x if x.ndim == 2 else _rows(ctx, Value(tensor=x))


@_ml("TreeEnsembleRegressor", "scikit-learn", "every tree walked at once, a level at a "
     "time; SUM, AVERAGE, MIN, MAX", attrs=(
         "aggregate_function", "base_values", "base_values_as_tensor", "n_targets",
         "nodes_falsenodeids", "nodes_featureids", "nodes_hitrates", "nodes_hitrates_as_tensor",
         "nodes_missing_value_tracks_true", "nodes_modes", "nodes_nodeids", "nodes_treeids",
         "nodes_truenodeids", "nodes_values", "nodes_values_as_tensor", "post_transform",
         "target_ids", "target_nodeids", "target_treeids", "target_weights",
         "target_weights_as_tensor"))
def _tree_regressor(ctx, node, args, attrs):
    targets = int(attrs.get("n_targets", 1))
    forest = _classic_forest(ctx, attrs, "target", targets)
    leaves = _leaf_nodes(_features(ctx, args[0]), forest, ctx)
    out = _aggregate(ctx, forest, leaves, attrs.get("aggregate_function", "SUM"),
                     _floats(attrs, "base_values"))
    return _t(post_transform(ctx, out, attrs.get("post_transform", "NONE")))


@_ml("TreeEnsembleClassifier", "scikit-learn", "every tree walked at once; labels of the "
     "highest score", attrs=(
         "base_values", "base_values_as_tensor", "class_ids", "class_nodeids", "class_treeids",
         "class_weights", "class_weights_as_tensor", "classlabels_int64s",
         "classlabels_strings", "nodes_falsenodeids", "nodes_featureids", "nodes_hitrates",
         "nodes_hitrates_as_tensor", "nodes_missing_value_tracks_true", "nodes_modes",
         "nodes_nodeids", "nodes_treeids", "nodes_truenodeids", "nodes_values",
         "nodes_values_as_tensor", "post_transform"))
def _tree_classifier(ctx, node, args, attrs):
    labels = _class_labels(ctx, attrs, "classlabels_int64s")
    classes = labels.size
    forest = _classic_forest(ctx, attrs, "class", classes)
    leaves = _leaf_nodes(_features(ctx, args[0]), forest, ctx)
    raw = _aggregate(ctx, forest, leaves, "SUM", _floats(attrs, "base_values"))
    kind = attrs.get("post_transform", "NONE")
    post_transform(ctx, raw, kind, classifier=True)  # checks the kind
    voted = np.flatnonzero(forest.weighted.any(axis=0))
    if classes == 2 and voted.size == 1:
        # binary: one score s for the second class; with weights all positive it is a
        # probability (the second class above 0.5), else a margin (above 0)
        s = raw[:, int(voted[0]):int(voted[0]) + 1]
        positive = bool((forest.weights[forest.weighted] >= 0).all())
        return [Value(tensor=label_above(ctx, s, labels, 0.5 if positive else 0.0)),
                Value(tensor=binary_scores(s, kind, complement=positive))]
    return [Value(tensor=labels_of(ctx, raw, labels)),
            Value(tensor=post_transform(ctx, raw, kind, classifier=True))]


def _v5_forest(ctx: Context, attrs: dict) -> Forest:
    """The tables of a TreeEnsemble (ai.onnx.ml opset 5): nodes, then leaves, in one index
    space; a BRANCH_MEMBER node takes the next NaN-separated run of membership_values."""
    splits = np.asarray(attrs.get("nodes_splits")).reshape(-1)
    n = splits.size
    mode = np.asarray(attrs.get("nodes_modes")).reshape(-1).astype(np.int64)
    if mode.size != n or ((mode < 0) | (mode > 6)).any():
        raise ctx.error("nodes_modes must give a mode from 0 (BRANCH_LEQ) to 6 "
                        "(BRANCH_MEMBER) per node")
    leaf_targets = _ints(attrs, "leaf_targetids")
    leaf_weights = np.asarray(attrs.get("leaf_weights")).reshape(-1)
    leaf_weights = leaf_weights.astype(np.result_type(leaf_weights.dtype, np.float32))
    leaves = leaf_targets.size
    targets = int(attrs.get("n_targets", 1))
    total = n + leaves

    def child(kind: str) -> np.ndarray:
        ids = _ints(attrs, f"nodes_{kind}nodeids")
        is_leaf = _ints(attrs, f"nodes_{kind}leafs")
        out = np.where(is_leaf > 0, ids + n, ids)
        if ((out < 0) | (out >= total)).any():
            raise ctx.error(f"nodes_{kind}nodeids name a node or leaf that does not exist")
        return np.concatenate([out, np.arange(n, total)])

    members: list = [None] * total
    runs = np.asarray(attrs.get("membership_values", []), dtype=np.float64).reshape(-1)
    sets = np.split(runs, np.flatnonzero(np.isnan(runs))) if runs.size else []
    sets = [r[~np.isnan(r)] for r in sets]
    for k, s in zip(np.flatnonzero(mode == 6), sets):
        members[k] = set(s.tolist())
    if sum(m is not None for m in members) != int((mode == 6).sum()):
        raise ctx.error("membership_values has fewer sets than BRANCH_MEMBER nodes")
    missing = _ints(attrs, "nodes_missing_value_tracks_true")
    missing_true = np.zeros(total, bool)
    if missing is not None and missing.size:
        missing_true[:n] = missing > 0
    weights = np.zeros((total, targets), leaf_weights.dtype)  # float64 ones stay float64
    weighted = np.zeros((total, targets), bool)
    for i, (t, w) in enumerate(zip(leaf_targets.tolist(), leaf_weights.tolist())):
        if not 0 <= t < targets:
            raise ctx.error(f"leaf {i} votes for target {t} of {targets}")
        weights[n + i, t] += w
        weighted[n + i, t] = True
    full_mode = np.concatenate([mode, np.full(leaves, LEAF)])
    true, false = child("true"), child("false")
    roots = _ints(attrs, "tree_roots")
    feature = np.concatenate([_ints(attrs, "nodes_featureids"), np.zeros(leaves, np.int64)])
    threshold = np.concatenate([splits, np.zeros(leaves, splits.dtype)])
    depth = _depth(true, false, full_mode, roots, ctx.error)
    return Forest(feature, threshold, full_mode, true, false, missing_true, members, roots,
                  weights, weighted, depth,
                  tracks_missing=missing is not None and missing.size > 0)


@_ml("TreeEnsemble", "scikit-learn", "ai.onnx.ml opset 5's form: nodes and leaves apart, "
     "BRANCH_MEMBER sets", attrs=(
         "aggregate_function", "leaf_targetids", "leaf_weights", "membership_values",
         "n_targets", "nodes_falseleafs", "nodes_falsenodeids", "nodes_featureids",
         "nodes_hitrates", "nodes_missing_value_tracks_true", "nodes_modes", "nodes_splits",
         "nodes_trueleafs", "nodes_truenodeids", "post_transform", "tree_roots"))
def _tree_ensemble(ctx, node, args, attrs):
    forest = _v5_forest(ctx, attrs)
    x = ctx.tensor(args[0])
    rows = x if x.ndim == 2 else _rows(ctx, Value(tensor=x))
    leaves = _leaf_nodes(rows, forest, ctx)
    aggregate, post = int(attrs.get("aggregate_function", 1)), int(attrs.get("post_transform", 0))
    if not 0 <= aggregate < len(AGGREGATES) or not 0 <= post < len(POST):
        raise ctx.error(f"aggregate_function {aggregate} or post_transform {post} is not one "
                        "of ONNX's")
    out = _aggregate(ctx, forest, leaves, AGGREGATES[aggregate], None)
    out = post_transform(ctx, out, POST[post])
    return _t(out if out.dtype == x.dtype else dx.cast(out, x.dtype))
