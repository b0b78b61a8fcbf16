"""NumPy's functions on tensors (`sdk/numpy_dispatch.py`): they build the node the dx function
builds and compute what NumPy computes in float64; what has no operator, or an argument a
node cannot honour, is a NumpyInteropError naming it; turning a tensor into an array fails at
once, naming dx.run."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.errors import DeepxError, GraphError

RNG = np.random.default_rng(7)
A = RNG.standard_normal((6, 5))
POS = RNG.uniform(0.5, 2.0, (6, 5))
B = RNG.standard_normal((5, 3))

UNARY = [(np.negative, dx.neg), (np.absolute, dx.abs), (np.exp, dx.exp), (np.log, dx.log),
         (np.sqrt, dx.sqrt), (np.tanh, dx.tanh), (np.sin, dx.sin), (np.cos, dx.cos),
         (np.tan, dx.tan), (np.floor, dx.floor), (np.ceil, dx.ceil), (np.rint, dx.round),
         (np.sign, dx.sign), (np.reciprocal, dx.reciprocal)]
BINARY = [(np.add, dx.add), (np.subtract, dx.sub), (np.multiply, dx.mul), (np.divide, dx.div),
          (np.power, dx.pow), (np.maximum, dx.maximum), (np.minimum, dx.minimum),
          (np.less, dx.less), (np.less_equal, dx.less_equal), (np.greater, dx.greater),
          (np.greater_equal, dx.greater_equal), (np.equal, dx.equal),
          (np.not_equal, dx.not_equal)]


def x_(shape=(6, 5), dtype="float64", name="x"):
    return dx.input(name, shape, dtype)


# -- the nodes built ----------------------------------------------------------------------
@pytest.mark.parametrize("ufunc,fn", UNARY, ids=lambda f: getattr(f, "__name__", ""))
def test_unary_ufunc_is_the_dx_function(ufunc, fn):
    x = x_()
    y = ufunc(x)
    assert isinstance(y, dx.Tensor) and y.node == fn(x).node


@pytest.mark.parametrize("ufunc,fn", BINARY, ids=lambda f: getattr(f, "__name__", ""))
def test_binary_ufunc_is_the_dx_function(ufunc, fn):
    x, y = x_(), x_(name="y")
    assert ufunc(x, y).node == fn(x, y).node
    assert ufunc(x, 2.0).node == fn(x, 2.0).node       # Python scalars stay weak
    assert ufunc(3, x).node == fn(3, x).node
    f32 = x_(dtype="float32")
    assert ufunc(f32, 2.0).dtype == ufunc(np.ones(1, "float32"), 2.0).dtype


def test_functions_build_their_nodes():
    x = x_()
    assert np.sum(x, axis=1).node == dx.sum(x, axis=1).node
    assert np.mean(x, axis=(0, 1), keepdims=True).node == x.mean((0, 1), True).node
    assert np.max(x).node == dx.max(x).node and np.amin(x, 0).node == dx.min(x, 0).node
    assert np.matmul(x, x_((5, 3), name="w")).node == dx.matmul(x, x_((5, 3), name="w")).node
    assert np.transpose(x).node == x.T.node
    assert np.reshape(x, (5, -1)).node == dx.reshape(x, (5, 6)).node
    assert np.clip(x, -1, 1).node == dx.clip(x, -1, 1).node
    assert np.argmax(x, axis=1).node == dx.argmax(x, axis=1).node


def test_mixed_operands_scalars_and_dtypes():
    x32 = x_(dtype="float32")
    assert np.float64(2) * x32 is not None and (np.float64(2) * x32).dtype == "float64"
    assert (np.float32(2) * x32).dtype == "float32"
    assert (x32 + np.ones(5, "float64")).dtype == "float64"  # arrays are strong, as in NumPy
    assert (x32 + np.array(2.0)).dtype == np.result_type(np.ones(1, "float32"),
                                                         np.array(2.0))
    c = np.ones((6, 5)) + x_()   # ndarray.__add__ defers to the tensor through np.add
    assert isinstance(c, dx.Tensor)
    assert c.parents[0].node.op == "input" and c.parents[0].node.id.startswith("const_")


def test_results_equal_numpy_in_float64(client):
    x, w, p = x_(), x_((5, 3), name="w"), x_(name="p")
    i32 = dx.input("i", (6, 5), "int32")
    ints = RNG.integers(-5, 5, (6, 5)).astype("int32")
    cases = {  # name -> (tensor, NumPy's answer)
        "exp": (np.exp(x), np.exp(A)),
        "log": (np.log(p), np.log(POS)),
        "sum1": (np.sum(x, axis=1), np.sum(A, axis=1)),
        "sum_keep": (np.sum(x, axis=0, keepdims=True), np.sum(A, axis=0, keepdims=True)),
        "mean": (np.mean(x, axis=0), np.mean(A, axis=0)),
        "max": (np.max(x, axis=1), np.max(A, axis=1)),
        "argmin": (np.argmin(x, axis=0), np.argmin(A, axis=0)),
        "matmul": (np.matmul(x, w), A @ B),
        "matmul_const": (np.matmul(x, B), A @ B),
        "rmatmul_const": (B.T @ np.transpose(x), B.T @ A.T),
        "dot": (np.dot(x, w), np.dot(A, B)),
        "dot_vec": (np.dot(x, B[:, 0]), np.dot(A, B[:, 0])),
        "const_left": (A + x * 2, A + A * 2),
        "const_right": (x - POS, A - POS),
        "where": (np.where(x > 0, x, -1.0), np.where(A > 0, A, -1.0)),
        "clip": (np.clip(x, -0.5, 0.5), np.clip(A, -0.5, 0.5)),
        "maximum": (np.maximum(x, 0), np.maximum(A, 0)),
        "square": (np.square(x), np.square(A)),
        "concat": (np.concatenate([x, p], axis=1), np.concatenate([A, POS], axis=1)),
        "concat_none": (np.concatenate([x, p], axis=None), np.concatenate([A, POS], None)),
        "stack": (np.stack([x, p], axis=1), np.stack([A, POS], axis=1)),
        "moveaxis": (np.moveaxis(np.expand_dims(x, 0), 0, -1),
                     np.moveaxis(np.expand_dims(A, 0), 0, -1)),
        "swapaxes": (np.swapaxes(x, 0, 1), np.swapaxes(A, 0, 1)),
        "squeeze": (np.squeeze(np.reshape(x, (1, 6, 1, 5)), axis=2),
                    np.squeeze(A.reshape(1, 6, 1, 5), axis=2)),
        "ravel": (np.ravel(x), np.ravel(A)),
        "take": (np.take(x, [4, 0, 4], axis=1), np.take(A, [4, 0, 4], axis=1)),
        "take_flat": (np.take(x, [7, 29]), np.take(A, [7, 29])),
        "take_along": (np.take_along_axis(x, np.argsort(A, axis=1), axis=1),
                       np.take_along_axis(A, np.argsort(A, axis=1), axis=1)),
        "pad": (np.pad(x, ((1, 0), (0, 2)), mode="reflect"),
                np.pad(A, ((1, 0), (0, 2)), mode="reflect")),
        "pad_const": (np.pad(x, 1, constant_values=3.0), np.pad(A, 1, constant_values=3.0)),
        "cumsum": (np.cumsum(x, axis=1), np.cumsum(A, axis=1)),
        "cumsum_flat": (np.cumsum(x), np.cumsum(A)),
        "cumsum_int32": (np.cumsum(i32, axis=0), np.cumsum(ints, axis=0)),
        "sum_dtype": (np.sum(i32, dtype="int8"), np.sum(ints, dtype="int8")),
        "add_reduce": (np.add.reduce(x), np.add.reduce(A)),
        "max_reduce": (np.maximum.reduce(x, axis=1, keepdims=True),
                       np.maximum.reduce(A, axis=1, keepdims=True)),
        "accumulate": (np.add.accumulate(x, axis=1), np.add.accumulate(A, axis=1)),
        "round": (np.round(x * 3), np.round(A * 3)),
        "full_like": (np.full_like(x, 2.5) + x, np.full_like(A, 2.5) + A),
        "zeros_like": (np.zeros_like(x, dtype="int32"), np.zeros_like(A, dtype="int32")),
        "ones_like": (np.ones_like(x, "float32"), np.ones_like(A, "float32")),
        "pow": (np.power(p, 1.5), np.power(POS, 1.5)),
        "compare": (np.greater_equal(x, p), np.greater_equal(A, POS)),
    }
    got = dx.run({k: t for k, (t, _) in cases.items()},
                 inputs={"x": A, "w": B, "p": POS, "i": ints}, client=client)
    for name, (t, want) in cases.items():
        assert got[name].dtype == want.dtype, name
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=1e-12, atol=1e-12, err_msg=name)


def test_shape_functions_answer_without_a_run():
    x = x_()
    assert np.shape(x) == (6, 5) and np.ndim(x) == 2 and np.size(x) == 30
    assert np.size(x, 1) == 5


# -- what is refused ----------------------------------------------------------------------
def refused(fn, match):
    with pytest.raises(dx.NumpyInteropError, match=match) as info:
        fn()
    assert isinstance(info.value, TypeError) and isinstance(info.value, GraphError)
    return info.value


@pytest.mark.parametrize("call,match", [
    (lambda x: np.log10(x), r"numpy\.log10 has no deepx_flow operator.*dx\.run"),
    (lambda x: np.linalg.svd(x), r"numpy\.linalg\.svd has no deepx_flow operator"),
    (lambda x: np.var(x), r"numpy\.var has no deepx_flow operator"),
    (lambda x: np.add.outer(x, x), r"numpy\.add\.outer has no deepx_flow operator"),
    (lambda x: np.multiply.reduce(x), r"numpy\.multiply\.reduce has no"),
    (lambda x: np.exp(x, out=np.empty((6, 5))), r"numpy\.exp: out=.*assign the result"),
    (lambda x: np.add(x, 1, where=np.ones((6, 5), bool)), r"numpy\.add: where=.*np\.where"),
    (lambda x: np.add(x, 1, dtype="float32"), r"numpy\.add: dtype='float32'.*float64"),
    (lambda x: np.matmul(x, x.T, axes=[(0, 1), (0, 1), (0, 1)]), r"numpy\.matmul: axes="),
    (lambda x: np.sum(x, where=np.ones((6, 5), bool)), r"numpy\.sum: where="),
    (lambda x: np.sum(x, initial=1.0), r"numpy\.sum: initial="),
    (lambda x: np.max(x, out=np.empty(5), axis=0), r"numpy\.max: out="),
    (lambda x: np.round(x, 2), r"numpy\.round: decimals=2"),
    (lambda x: np.where(x > 0), r"np\.where\(condition, x, y\)"),
    (lambda x: np.reshape(x, (5, 6), order="F"), r"numpy\.reshape: order='F'"),
    (lambda x: np.take(x, [0], axis=0, mode="clip"), r"numpy\.take: mode='clip'"),
    (lambda x: np.dot(np.reshape(x, (1, 6, 5)), x.T), r"numpy\.dot of 3-D and 2-D"),
    (lambda x: np.pad(x, 1, mode="symmetric"), r"numpy\.pad: mode='symmetric'"),
])
def test_refusals_name_the_function(call, match):
    refused(lambda: call(x_()), match)


def test_dtypes_numpy_would_give_otherwise_are_refused():
    i = dx.input("i", (4,), "int64")
    refused(lambda: np.rint(i), r"numpy\.rint of int64 gives float64 in NumPy, but dx\.round "
                                r"gives int64; cast the operands first")
    refused(lambda: np.reciprocal(i), r"numpy\.reciprocal of int64 gives int64")
    assert np.rint(i.astype("float64")).dtype == "float64"


def test_an_inplace_numpy_operator_is_refused():
    a = np.ones((6, 5))
    with pytest.raises(dx.NumpyInteropError, match="out="):
        a += x_()


# -- no conversion to an array, at once -----------------------------------------------------
@pytest.mark.parametrize("convert", [np.asarray, np.array, np.asanyarray, list, tuple,
                                     lambda t: np.array([t, t]), lambda t: [v for v in t],
                                     lambda t: np.testing.assert_allclose(t, 0),
                                     np.float64, float, int])
def test_conversion_fails_at_once_naming_dx_run(convert):
    big = dx.input("big", (200_000, 512), "float32")  # NumPy used to iterate 10^8 elements
    start = time.perf_counter()
    with pytest.raises(TypeError, match=r"dx\.run\(t\) or t\.compute\(\)") as info:
        convert(big)
    assert time.perf_counter() - start < 1.0
    assert isinstance(info.value, DeepxError)


def test_conversion_does_not_hang_in_a_thread():
    """np.asarray of a tensor used to spin for seconds: it must return within a second."""
    errors = []

    def convert():
        try:
            np.asarray(dx.input("x", (10_000_000,), "float32"))
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    thread = threading.Thread(target=convert)
    thread.start()
    thread.join(1.0)
    assert not thread.is_alive() and isinstance(errors[0], dx.NumpyInteropError)


# -- compute and the notebook view ---------------------------------------------------------
def test_compute_is_dx_run(client):
    x = x_()
    got = np.exp(x).compute(inputs={"x": A}, client=client)
    np.testing.assert_allclose(got, np.exp(A), rtol=1e-12)
    np.testing.assert_array_equal((np.ones(3) * 2 + dx.arange(3)).compute(client=client),
                                  np.ones(3) * 2 + np.arange(3))


def test_html_repr_is_escaped_and_counts_nodes():
    x = dx.input("x", (6, 5), "float32").named("<b>&x")
    y = np.exp(x) + np.ones(5, "float32")
    text = y.named("out<script>")._repr_html_()
    assert "out&lt;script&gt;" in text and "<script>" not in text
    assert "<code>add</code>" in text and "(6, 5)" in text and "float32" in text
    assert "4 nodes, 1 bound to data" in text   # x, the constant, exp, add
    assert "&lt;b&gt;&amp;x" in x._repr_html_()
    assert repr(y) == "<Tensor add shape=(6, 5) dtype=float32>"
