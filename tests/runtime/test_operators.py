"""Every operator against NumPy in float64, under three chunk grids with uneven edges.

The grids come from the registry, as in real use: the same graph is planned for clusters
whose workers have less and less memory, which forces smaller chunks. Shapes are odd so that
edge chunks are uneven.
"""

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from tests.helpers import cluster_with_memory

# Worker memories giving one chunk, a few chunks, and many small uneven chunks.
MEMORIES = (2**30, 8 * 2**10, 2 * 2**10)
RNG = np.random.default_rng(0)
A = RNG.standard_normal((37, 23))
B = RNG.standard_normal((37, 23))
POS = RNG.uniform(0.5, 2.0, (37, 23))
ROW = RNG.standard_normal((23,))

TOL = {"float64": (1e-10, 1e-12), "float32": (2e-5, 1e-5), "float16": (1e-2, 1e-2)}


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def run_all_grids(client, build, inputs, dtype="float32", memories=MEMORIES):
    """Run the graph `build(*tensors)` under each memory size; return results and grids."""
    tensors = {k: dx.input(k, v.shape, dtype if v.dtype.kind == "f" else v.dtype.name)
               for k, v in inputs.items()}
    out = build(**tensors)
    feed = {k: v.astype(tensors[k].dtype) for k, v in inputs.items()}
    results, grids = [], set()
    for memory in memories:
        spec = cluster_with_memory(memory)
        plan = compile_graph(dx.build_graph(out), spec)
        grids.add(tuple(plan.chunks[out.node.id]) + tuple(plan.chunks[next(iter(tensors))]))
        results.append(dx.run(out, inputs=feed, client=client, cluster=spec))
    return results, grids


def check(results, expected, dtype):
    rtol, atol = TOL.get(dtype, (0, 0))
    for got in results:
        assert got.shape == np.shape(expected)
        if got.dtype.kind in "biu":
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got.astype("float64"), expected, rtol=rtol, atol=atol)


UNARY = {
    "neg": (dx.neg, np.negative, A), "abs": (dx.abs, np.abs, A), "exp": (dx.exp, np.exp, A),
    "log": (dx.log, np.log, POS), "sqrt": (dx.sqrt, np.sqrt, POS),
    "tanh": (dx.tanh, np.tanh, A), "sigmoid": (dx.sigmoid, lambda x: 1 / (1 + np.exp(-x)), A),
    "relu": (dx.relu, lambda x: np.maximum(x, 0), A), "gelu": (dx.gelu, gelu, A),
    "sin": (dx.sin, np.sin, 3 * A), "cos": (dx.cos, np.cos, 3 * A),
    "tan": (dx.tan, np.tan, np.clip(A, -1.3, 1.3)),
    "floor": (dx.floor, np.floor, 2 * A), "ceil": (dx.ceil, np.ceil, 2 * A),
    # halves (which go to the even neighbour) among the values
    "round": (dx.round, np.rint, np.round(4 * A) / 2), "sign": (dx.sign, np.sign, A),
    "reciprocal": (dx.reciprocal, lambda x: 1 / x, POS * np.sign(A)),
    "softplus": (dx.softplus, lambda x: np.logaddexp(0, x), 30 * A),
    "leaky_relu": (lambda x: dx.nn.leaky_relu(x, 0.1), lambda x: np.where(x < 0, 0.1 * x, x),
                   A),
    "clip": (lambda x: dx.clip(x, -0.5, 0.75), lambda x: np.clip(x, -0.5, 0.75), A),
    "sinh": (dx.sinh, np.sinh, 3 * A), "cosh": (dx.cosh, np.cosh, 3 * A),
    "asinh": (dx.asinh, np.arcsinh, 10 * A), "acosh": (dx.acosh, np.arccosh, 1 + 10 * POS),
    "atanh": (dx.atanh, np.arctanh, np.tanh(A)),
    # the activations of dx.nn, as ONNX defines them, written out here
    "elu": (lambda x: dx.nn.elu(x, 0.7), lambda x: np.where(x < 0, 0.7 * np.expm1(x), x), A),
    # ONNX's default constants are SELU's rounded to float32
    "selu": (dx.nn.selu, lambda x: float(np.float32(1.0507009873554805)) * np.where(
        x > 0, x, float(np.float32(1.6732632423543772)) * np.expm1(x)), A),
    "celu": (lambda x: dx.nn.celu(x, 1.5), lambda x: np.maximum(0, x) + np.minimum(
        0, 1.5 * np.expm1(x / 1.5)), A),
    "thresholded_relu": (lambda x: dx.nn.thresholded_relu(x, 0.4),
                         lambda x: np.where(x > 0.4, x, 0.0), A),
    "hard_sigmoid": (dx.nn.hard_sigmoid, lambda x: np.clip(0.2 * x + 0.5, 0, 1), 4 * A),
    "hard_swish": (dx.nn.hard_swish, lambda x: x * np.clip(x / 6 + 0.5, 0, 1), 5 * A),
    "mish": (dx.nn.mish, lambda x: x * np.tanh(np.log1p(np.exp(x))), 3 * A),
    "prelu": (lambda x: dx.nn.prelu(x, ROW.astype(x.dtype)),
              lambda x: np.where(x < 0, ROW * x, x), A),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(client, name, dtype):
    fn, ref, data = UNARY[name]
    results, grids = run_all_grids(client, lambda x: fn(x), {"x": data}, dtype)
    assert len(grids) == 3
    check(results, ref(data.astype(dtype).astype("float64")), dtype)


BINARY = {
    "add": (lambda a, b: a + b, np.add), "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply), "div": (lambda a, b: a / b, np.divide),
    "pow": (lambda a, b: a ** b, np.power), "maximum": (dx.maximum, np.maximum),
    "minimum": (dx.minimum, np.minimum),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_broadcasting(client, name):
    fn, ref = BINARY[name]
    a = POS if name == "pow" else A
    results, _ = run_all_grids(client, lambda x, r: fn(x, r), {"x": a, "r": ROW})
    x32, r32 = a.astype("float32").astype("float64"), ROW.astype("float32").astype("float64")
    check(results, ref(x32, r32), "float32")


@pytest.mark.parametrize("op", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_comparisons(client, op):
    ops = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}
    b = np.where(RNG.uniform(size=A.shape) < 0.3, A, B)  # some equal elements
    fn = {"lt": dx.less, "le": dx.less_equal, "gt": dx.greater, "ge": dx.greater_equal,
          "eq": dx.equal, "ne": dx.not_equal}[op]
    results, _ = run_all_grids(client, lambda x, y: fn(x, y), {"x": A, "y": b}, "float64")
    check(results, ops[op](A, b), "bool")


def test_where_and_cast(client):
    results, _ = run_all_grids(
        client, lambda x, y: dx.where(x > 0, x, y * 2.0).astype("float64") + 1,
        {"x": A, "y": B})
    a32, b32 = A.astype("float32"), B.astype("float32")
    check(results, np.where(a32 > 0, a32, b32 * np.float32(2)).astype("float64") + 1, "float64")
    results, _ = run_all_grids(client, lambda x: (x * 10).astype("int32"), {"x": A}, "float64")
    check(results, (A * 10).astype("int32"), "int32")


def test_mixed_dtypes_follow_numpy(client):
    ints = RNG.integers(-5, 5, A.shape).astype("int32")
    results, _ = run_all_grids(client, lambda x, i: x * i + i / 2, {"x": A, "i": ints},
                               "float32")
    x = A.astype("float32")
    expected = x * ints + ints / 2
    assert results[0].dtype == expected.dtype
    check(results, expected.astype("float64"), "float64" if expected.dtype == "float64"
          else "float32")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_2d_with_epilogue(client, dtype):
    w = RNG.standard_normal((23, 31))
    results, grids = run_all_grids(client, lambda x, w: dx.relu(x @ w + 1.0),
                                   {"x": A, "w": w}, dtype)
    ref = np.maximum(A.astype(dtype).astype("float64") @ w.astype(dtype).astype("float64")
                     + 1.0, 0)
    assert len(grids) == 3
    rtol, atol = TOL[dtype]
    for got in results:
        np.testing.assert_allclose(got, ref, rtol=rtol * 10, atol=atol * 10)


def test_batched_matmul_broadcasts_batch(client):
    a = RNG.standard_normal((3, 9, 13))
    b = RNG.standard_normal((13, 7))
    c = RNG.standard_normal((1, 7, 5))
    results, _ = run_all_grids(client, lambda a, b, c: (a @ b) @ c, {"a": a, "b": b, "c": c},
                               "float64")
    check(results, (a @ b) @ c, "float64")


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 1), True),
                                           (-1, False)])
def test_reductions(client, op, axis, keepdims):
    fn = getattr(dx, op)
    results, _ = run_all_grids(client, lambda x: fn(dx.exp(x) - 1.0, axis=axis,
                                                     keepdims=keepdims), {"x": A}, "float64")
    check(results, getattr(np, op)(np.exp(A) - 1.0, axis=axis, keepdims=keepdims), "float64")


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True)])
def test_prod(client, axis, keepdims):
    values = np.exp(0.1 * A)
    results, _ = run_all_grids(client, lambda x: dx.prod(x, axis=axis, keepdims=keepdims),
                               {"x": values}, "float64")
    check(results, np.prod(values, axis=axis, keepdims=keepdims), "float64")


def test_prod_multiplies_up_in_float64_and_keeps_numpys_dtypes(client):
    """A float32 product whose partial products leave float32's range still comes out right
    (rounded once from float64); integers multiply exactly in NumPy's result dtype; an empty
    axis gives 1; zeros give zeros."""
    big = np.full((6, 16), 1e30, np.float32)  # 1e240 on the way: past float32, not float64
    big[:, 8:] = 1e-30
    big[5, 3] = 0.0
    ints = RNG.integers(-3, 4, (37, 5)).astype("int32")
    x, i = dx.input("x", big.shape, "float32"), dx.input("i", ints.shape, "int32")
    e = dx.input("e", (3, 0), "float32")
    p, q, r = dx.run([x.prod(axis=1), i.prod(axis=0), e.prod(axis=1)],
                     inputs={"x": big, "i": ints, "e": np.zeros((3, 0), np.float32)},
                     client=client, cluster=cluster_with_memory(MEMORIES[2]))
    assert p.dtype == np.float32 and q.dtype == ints.prod(axis=0).dtype
    want = np.prod(big.astype(np.float64), axis=1).astype(np.float32)
    np.testing.assert_array_equal(p, want)
    assert p[5] == 0 and np.all(np.abs(p[:5] - 1) < 1e-6)  # not inf or NaN
    np.testing.assert_array_equal(q, ints.prod(axis=0))
    np.testing.assert_array_equal(r, np.ones(3, np.float32))


def test_integer_sum_and_mean_follow_numpy(client):
    ints = RNG.integers(-100, 100, (37, 23)).astype("int32")
    x = dx.input("i", ints.shape, "int32")
    s, m = dx.run([x.sum(axis=0), x.mean()], inputs={"i": ints}, client=client,
                  cluster=cluster_with_memory(MEMORIES[2]))
    assert s.dtype == ints.sum(axis=0).dtype and m.dtype == np.float64
    np.testing.assert_array_equal(s, ints.sum(axis=0))
    np.testing.assert_allclose(m, ints.mean(), rtol=1e-12)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, 1])
def test_softmax(client, op, axis):
    fn = getattr(dx, op)
    results, _ = run_all_grids(client, lambda x: fn(x * 3.0, axis=axis), {"x": A}, "float64")
    z = A * 3.0
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    sm = e / e.sum(axis=axis, keepdims=True)
    check(results, sm if op == "softmax" else np.log(sm), "float64")


@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_fused_into_its_consumers(client, axis):
    # The entropy along an axis: both softmaxes and the product run inside the sum's tasks.
    def build(x):
        z = x * 3.0
        return -(dx.softmax(z, axis=axis) * dx.log_softmax(z, axis=axis)).sum(axis=axis)
    results, _ = run_all_grids(client, build, {"x": A}, "float64")
    z = A * 3.0
    log_p = z - z.max(axis=axis, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=axis, keepdims=True))
    check(results, -(np.exp(log_p) * log_p).sum(axis=axis), "float64")


def test_transpose_reshape_concat_slice(client):
    def build(x, y):
        t = (x.T * 2.0)[:, 3:30:2]                       # (23, 14)
        r = dx.reshape(t, (46, 7))
        c = dx.concat([r, dx.reshape(y[:, :2], (74, 1))[:46]], axis=1)
        return c[::3, 1:] + 1.0
    results, _ = run_all_grids(client, build, {"x": A, "y": B}, "float64")
    t = (A.T * 2.0)[:, 3:30:2]
    c = np.concatenate([t.reshape(46, 7), B[:, :2].reshape(74, 1)[:46]], axis=1)
    check(results, c[::3, 1:] + 1.0, "float64")


def test_indexing_with_integers_and_newaxis(client):
    results, _ = run_all_grids(client, lambda x: x[5, None, ::2] * x[:, 0].sum(),
                               {"x": A}, "float64")
    check(results, A[5, None, ::2] * A[:, 0].sum(), "float64")


def test_constants_and_arange(client):
    x = dx.arange(5, 200, 3, dtype="float64")
    y = x * dx.ones((65,), "float64") + dx.full((65,), 0.5, "float64") + dx.zeros((65,), "float64")
    for memory in MEMORIES:
        got = dx.run(y, client=client, cluster=cluster_with_memory(memory))
        np.testing.assert_allclose(got, np.arange(5, 200, 3, dtype="float64") + 0.5)


def test_random_tensors_ignore_the_chunk_grid_and_look_random(client):
    n = dx.random.normal((301, 97), seed=7, mean=1.0, std=2.0, dtype="float64")
    u = dx.random.uniform((301, 97), seed=7, low=-1.0, high=3.0, dtype="float32")
    runs = [dx.run([n, u], client=client, cluster=cluster_with_memory(m)) for m in MEMORIES]
    for got_n, got_u in runs[1:]:
        np.testing.assert_array_equal(got_n, runs[0][0])
        np.testing.assert_array_equal(got_u, runs[0][1])
    normal, uniform = runs[0]
    assert abs(normal.mean() - 1.0) < 0.05 and abs(normal.std() - 2.0) < 0.05
    assert uniform.min() >= -1.0 and uniform.max() < 3.0 and abs(uniform.mean() - 1.0) < 0.05
    other = dx.run(dx.random.normal((301, 97), seed=8, dtype="float64"), client=client)
    assert not np.allclose(other, (normal - 1.0) / 2.0)


def test_softmax_along_both_axes_of_one_tensor(client):
    x = dx.input("x", A.shape, "float64")
    e0 = np.exp(A - A.max(axis=0, keepdims=True))
    e1 = A - A.max(axis=1, keepdims=True)
    # At the smallest size a column must arrive in pieces and be assembled: it cannot fit.
    for memory in (2**30, 8 * 2**10, 4 * 2**10):
        s0, s1 = dx.run([dx.softmax(x, 0), dx.log_softmax(x, 1)], inputs={"x": A},
                        client=client, cluster=cluster_with_memory(memory))
        np.testing.assert_allclose(s0, e0 / e0.sum(axis=0, keepdims=True), rtol=1e-12)
        np.testing.assert_allclose(s1, e1 - np.log(np.exp(e1).sum(axis=1, keepdims=True)),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,new", [((600, 10), (400, 15)), ((4, 9, 40), (36, 40)),
                                       ((37, 23), (23, 37)), ((1, 851), (851,)),
                                       ((851,), (37, 23)), ((37, 23), (1, 37, 1, 23))])
def test_reshape_with_rows_that_do_not_line_up(client, shape, new):
    # A reshape task may read up to one operand row past each end of its run, so the
    # smallest budgets here are a few rows, not a few elements.
    data = np.arange(np.prod(shape), dtype="float64").reshape(shape)
    results, grids = run_all_grids(client, lambda x: (x * 2.0).reshape(new) + 1.0,
                                   {"x": data}, "float64", memories=(2**30, 64 * 2**10,
                                                                     32 * 2**10))
    assert len(grids) >= 2
    check(results, (data * 2.0).reshape(new) + 1.0, "float64")
