"""Fuzzing the public `dx.*` functions' non-tensor arguments (issue 30, acceptance): wrong
types, negative, NaN, infinite, huge (2**70) and empty values get a `DeepxError` (or a valid
result), never another exception. Tensors built from such arguments are compiled too, for a
cluster file (no cluster runs), so a value the builder took must also plan or be refused with
a DeepxError. Calls that run (`dx.run`, `dx.persist`) are given the session's cluster, so an
argument that turns out valid runs there, on a tiny graph.

The reported cases are tested by name beside the fuzz (`test_reported_*`).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.errors import DeepxError, GraphError, InputError

CLUSTER = Path(__file__).resolve().parents[2] / "graphs" / "clusters" / "8xH100.yaml"
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_N", 150)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# -- values no argument should crash on ------------------------------------------------------
HUGE = [2**70, -2**70, 2**63, 2**63 - 1, -2**63, 2**31, 10**400]
ATOMS = st.one_of(
    st.none(), st.booleans(),
    st.integers(-3, 4), st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 0.5, 2.5]),
    st.sampled_from(["", " ", "abc", "x", "float32", "int64", "bool", "constant", "reflect",
                     "edge", "mean", "sum", "none", "error", "fill", "\x00", "é", "1"]),
    st.sampled_from([np.int64(2), np.float32("nan"), np.bool_(True), np.int8(-1),
                     np.uint64(2**64 - 1), np.float64(1e300)]),
    st.sampled_from([(), [], {}, set(), b"", object(), slice(None), Ellipsis,
                     np.zeros(0), np.zeros((2, 2)), type, print]),
)
SMALL = st.one_of(ATOMS, st.lists(ATOMS, max_size=4), st.tuples(ATOMS, ATOMS),
                  st.dictionaries(st.text(max_size=3), ATOMS, max_size=2),
                  st.lists(st.integers(-3, 4), min_size=1, max_size=5).map(tuple))
# A value or its nest: shapes of shapes, pads of pads.
BAD = st.recursive(SMALL, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.tuples(inner, inner)), max_leaves=6)


def only_deepx_errors(call, *args, **kwargs):
    """Call; a DeepxError is fine, another exception fails the test. A Tensor returned is
    compiled for a cluster file, under the same rule. Returns the result (None if refused)."""
    try:
        result = call(*args, **kwargs)
    except DeepxError as err:
        message = str(err).strip()
        assert message and "\n" not in message and len(message) < 1000, repr(message[:2000])
        return None
    if isinstance(result, dx.Tensor):
        assert all(isinstance(s, int) and s >= 0 for s in result.shape), result.shape
        try:
            dx.compile(result, cluster=CLUSTER)
        except DeepxError:
            pass
    return result


@contextlib.contextmanager
def no_cluster():
    """Fail if a cluster is started or looked for: an argument error comes before that."""
    from deepx_flow.runtime import cluster as runtime_cluster

    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was started or looked for")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime_cluster, "shared_client", refuse)
        patch.setattr(runtime_cluster, "current_client", refuse)
        yield


X = dx.input("x", shape=(4, 6), dtype="float32")
IMAGES = dx.input("img", shape=(2, 3, 8, 8), dtype="float32")
FILTERS = dx.input("w", shape=(4, 3, 3, 3), dtype="float32")


# -- graph building ---------------------------------------------------------------------------
BUILDERS = {
    "input": lambda a, b, c: dx.input(a, b, c),
    "input_name": lambda a, b, c: dx.input(a, (2, 2)),
    "input_shape": lambda a, b, c: dx.input("x", a),
    "input_dtype": lambda a, b, c: dx.input("x", (2, 2), a),
    "normal": lambda a, b, c: dx.random.normal(a, seed=b, dtype=c),
    "normal_params": lambda a, b, c: dx.random.normal((3,), seed=0, mean=a, std=b),
    "uniform": lambda a, b, c: dx.random.uniform(a, seed=b, dtype=c),
    "uniform_params": lambda a, b, c: dx.random.uniform((3,), seed=c, low=a, high=b),
    "full": lambda a, b, c: dx.full(a, b, c),
    "full_value": lambda a, b, c: dx.full((2,), a, c),
    "zeros": lambda a, b, c: dx.zeros(a, b),
    "ones": lambda a, b, c: dx.ones(a, b),
    "arange": lambda a, b, c: dx.arange(a, b, c),
    "arange_dtype": lambda a, b, c: dx.arange(0, 3, 1, a),
    "sum": lambda a, b, c: dx.sum(X, a, b),
    "mean": lambda a, b, c: dx.mean(X, axis=a, keepdims=b),
    "max": lambda a, b, c: X.max(a, b),
    "min": lambda a, b, c: dx.min(X, a, c),
    "argmax": lambda a, b, c: dx.argmax(X, a, b),
    "argmin": lambda a, b, c: X.argmin(axis=a, keepdims=c),
    "reshape": lambda a, b, c: dx.reshape(X, a),
    "reshape_method": lambda a, b, c: X.reshape(a, b),
    "transpose": lambda a, b, c: dx.transpose(X, a),
    "transpose_method": lambda a, b, c: X.transpose(a, b),
    "getitem": lambda a, b, c: X[a],
    "getitem_pair": lambda a, b, c: X[a, b],
    "getitem_slice": lambda a, b, c: X[slice(a, b, c)],
    "concat": lambda a, b, c: dx.concat([X, X], a),
    "concat_list": lambda a, b, c: dx.concat(a, 0),
    "pad": lambda a, b, c: dx.pad(X, a, b, c),
    "pad_widths": lambda a, b, c: dx.pad(X, a),
    "pad_mode": lambda a, b, c: dx.pad(X, 1, a, b),
    "clip": lambda a, b, c: dx.clip(X, a, b),
    "cumsum": lambda a, b, c: dx.cumsum(X, a, b, c),
    "softmax": lambda a, b, c: dx.softmax(X, a),
    "log_softmax": lambda a, b, c: dx.log_softmax(X, a),
    "cast": lambda a, b, c: dx.cast(X, a),
    "astype": lambda a, b, c: X.astype(a),
    "take": lambda a, b, c: dx.take(X, a, b),
    "binary_scalar": lambda a, b, c: X + a,
    "pow_scalar": lambda a, b, c: X ** a,
    "conv": lambda a, b, c: dx.nn.conv(IMAGES, FILTERS, stride=a, padding=b, dilation=c),
    "conv_groups": lambda a, b, c: dx.nn.conv(IMAGES, FILTERS, groups=a),
    "max_pool": lambda a, b, c: dx.nn.max_pool(IMAGES, a, stride=b, padding=c),
    "avg_pool": lambda a, b, c: dx.nn.avg_pool(IMAGES, a, b, c),
    "conv_transpose": lambda a, b, c: dx.nn.conv_transpose(
        IMAGES, dx.input("wt", (3, 2, 3, 3)), stride=a, padding=b, output_padding=c),
    "one_hot": lambda a, b, c: dx.nn.one_hot(dx.input("l", (4,), "int64"), a, b),
    "dropout": lambda a, b, c: dx.nn.dropout(X, a, b, c),
    "leaky_relu": lambda a, b, c: dx.nn.leaky_relu(X, a),
    "layer_norm": lambda a, b, c: dx.nn.layer_norm(X, axis=a, eps=b),
    "group_norm": lambda a, b, c: dx.nn.group_norm(
        IMAGES, a, dx.input("s", (3,)), dx.input("b", (3,)), eps=b),
    "cross_entropy": lambda a, b, c: dx.nn.cross_entropy(
        X, dx.input("l", (4,), "int64"), reduction=a, axis=b),
    "mse": lambda a, b, c: dx.nn.mse(X, X, reduction=a),
    "linear": lambda a, b, c: dx.nn.Linear(a, b),
    "read_zarr": lambda a, b, c: dx.read_zarr(a, missing=b),
}


@FUZZ
@given(st.sampled_from(sorted(BUILDERS)), BAD, BAD, BAD)
def test_graph_builders_raise_only_deepx_errors(name, a, b, c):
    only_deepx_errors(BUILDERS[name], a, b, c)


OPTIMIZERS = {
    "SGD": ("lr", "momentum", "nesterov", "weight_decay", "clip_norm", "schedule"),
    "Adam": ("lr", "betas", "eps", "weight_decay", "clip_norm", "schedule"),
    "AdamW": ("lr", "betas", "eps", "weight_decay", "clip_norm", "schedule"),
    "RMSProp": ("lr", "alpha", "eps", "momentum", "weight_decay", "clip_norm", "schedule"),
}


@FUZZ
@given(st.sampled_from(sorted(OPTIMIZERS)), st.data())
def test_optimizer_hyperparameters_raise_only_deepx_errors(name, data):
    fields = OPTIMIZERS[name]
    kwargs = {f: data.draw(BAD, label=f) for f in
              data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True))}
    optimizer = only_deepx_errors(getattr(dx.optim, name), **kwargs)
    if optimizer is not None:  # taken: its numbers are finite and its update graph builds
        for step in (1, 2, 10**6):
            assert all(math.isfinite(v) for v in optimizer.scalars(step).values())
        params = {"w": dx.input("w", (3,))}
        scalars = {k: dx.input(k, ()) for k in optimizer.scalars(1)}
        only_deepx_errors(lambda: optimizer.update(params, {"w": dx.input("g", (3,))},
                                                   optimizer.init(params), scalars).params["w"])


SECONDS = ("backoff", "backoff_max", "timeout", "speculation_min", "worker_wait")
RECOVERY_FIELDS = ("retries", "backoff", "backoff_max", "timeout", "speculate",
                   "speculation_factor", "speculation_min", "exclude_after", "worker_wait",
                   "replan_on_oom", "read_back", "recompute_damaged", "operators")


@FUZZ
@given(st.sampled_from(RECOVERY_FIELDS), BAD)
def test_recovery_fields_raise_only_deepx_errors(field, value):
    taken = only_deepx_errors(dx.Recovery, **{field: value})
    if taken is not None and field != "operators" and value is not None:  # a number in range
        value = getattr(taken, field)
        if not isinstance(value, bool):
            assert 0 <= value and math.isfinite(float(value))
            assert value <= 7 * 24 * 3600 or field not in SECONDS
            assert value <= 10**6 or field not in ("retries", "exclude_after", "replan_on_oom")


# -- reading stored arrays ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    import zarr
    path = tmp_path_factory.mktemp("fuzz") / "a.zarr"
    array = zarr.create_array(path, shape=(4, 6), chunks=(2, 3), dtype="float32")
    array[:] = np.arange(24, dtype="float32").reshape(4, 6)
    return str(path)


@FUZZ
@given(BAD)
def test_read_zarr_missing_raises_only_deepx_errors(stored, missing):
    taken = only_deepx_errors(dx.read_zarr, stored, missing=missing)
    assert taken is None or missing in ("error", "fill")


# -- training: the arguments checked before anything runs --------------------------------------
def _not_valid(valid):
    return BAD.filter(lambda v: not valid(v))


def _count(low, high):
    """Whether a value is a count a training takes (so the fuzz leaves it out: it would run)."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


TRAIN_ARGS = {
    "batch_size": _not_valid(_count(1, 8)),
    "epochs": _not_valid(_count(1, 2**62)),
    "seed": _not_valid(_count(0, 2**63 - 1)),
    "steps_per_graph": _not_valid(_count(1, 2**70)),
    "eval_every": _not_valid(lambda v: v is None or _count(1, 2**70)(v)),
    "checkpoint_every": _not_valid(lambda v: v is None),
    "progress": _not_valid(lambda v: v is None or isinstance(v, bool)),
    "optimizer": _not_valid(lambda v: v is None),
}


@FUZZ
@given(st.sampled_from(sorted(TRAIN_ARGS)), st.data())
def test_train_arguments_raise_only_deepx_errors_before_running(name, data):
    value = data.draw(TRAIN_ARGS[name], label=name)
    features, labels = np.zeros((8, 3), "float32"), np.zeros((8, 1), "float32")
    params = {"w": np.zeros((3, 1), "float32")}
    with no_cluster(), pytest.raises(DeepxError):  # every value drawn is refused, at once
        dx.train(lambda p, x, y: dx.nn.mse(x @ p["w"], y), params, (features, labels),
                 **{"batch_size": 4, **{name: value}})


# -- runs: on the session's cluster, where an argument that is valid after all runs ---------------
RUN_ARGS = ("inputs", "client", "scheduler", "cluster", "recovery", "progress", "replan")
RUN_FUZZ = settings(FUZZ, max_examples=int(os.environ.get("FUZZ_N", 40)))
A = np.arange(24, dtype="float32").reshape(4, 6)


@RUN_FUZZ
@given(st.sampled_from(RUN_ARGS), BAD, st.sampled_from(["run", "persist", "compile"]))
def test_run_arguments_raise_only_deepx_errors(client, name, value, verb):
    kwargs = {"inputs": {"x": A}, "client": client, name: value}
    if verb == "compile":
        kwargs = {k: v for k, v in kwargs.items() if k in ("client", "cluster", "replan")}
        if name not in kwargs:
            return
    if verb == "persist":
        kwargs.pop("progress", None)
        if name == "progress":
            return
    if name == "client" and value is None:
        return  # the embedded cluster: not started in this test
    result = only_deepx_errors(getattr(dx, verb), X + 1, **kwargs)
    if verb == "run" and result is not None:
        np.testing.assert_array_equal(result, A + 1)
    if verb == "persist" and result is not None:
        np.testing.assert_array_equal(result.to_numpy(), A + 1)
        result.release()


@FUZZ
@given(BAD)
def test_outputs_raise_only_deepx_errors(outputs):
    only_deepx_errors(dx.compile, outputs, cluster=CLUSTER)
