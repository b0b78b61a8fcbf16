"""bfloat16 as a storage type, through the whole engine: its dtype rules, elementwise
programs, reductions, matmul, softmax, convolution and pooling, casts, under the default plan
and under budgets that cut every tensor into many chunks; `dx.run` and GPU refusals.

References: NumPy with ml_dtypes op by op (each operator in float32 from the widened operands,
rounded to bfloat16 once), and float64 with bfloat16's tolerance (2**-8 relative, half a
step) where only the rounding is exact. Sums add up in float64 and round once: on data whose
float64 sums are exact (bfloat16 values on a coarse grid) they are compared bit for bit with
the exact sum rounded once.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.batch_chain import batch_chains
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.ir import dtypes
from deepx_flow.kernels.bfloat16 import to_bfloat16
from deepx_flow.registry.cluster import ClusterSpec, DeviceSpec, WorkerSpec
from tests.compiler.test_inline import MEMORIES, evaluate, lowered
from tests.helpers import cluster_with_memory

BF16 = np.dtype(ml_dtypes.bfloat16)
TINY = MEMORIES[-1]  # 24 KiB: every tensor here is many chunks
HALF_STEP = 2.0**-8  # bfloat16's relative rounding error


def f32(x):
    return np.asarray(x).astype(np.float32)


def same(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != BF16 or want.dtype != BF16 or got.shape != want.shape:
        return False
    nan = np.isnan(f32(got))
    return bool(np.array_equal(nan, np.isnan(f32(want))) and
                np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan]))


def bf16_data(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(BF16)


def coarse(shape, seed=0):
    """bfloat16 values that are multiples of 2**-12 below 8 in magnitude: any float64 sum of
    fewer than 2**37 of them is exact, whatever its order."""
    x = bf16_data(shape, seed, 2.0)
    wide = f32(x)
    wide[np.abs(wide) < 2**-5] = 0  # 8 significant bits at >= 2**-5: multiples of 2**-12
    return np.clip(wide, -7.9, 7.9).astype(BF16)


# -- the dtype -------------------------------------------------------------------------------
def test_the_dtype_is_a_float_of_two_bytes_that_sums_in_float64():
    assert dtypes.normalize("bfloat16") == dtypes.normalize(BF16) == "bfloat16"
    assert dtypes.is_float("bfloat16") and not dtypes.is_float("int16")
    assert dtypes.itemsize("bfloat16") == 2
    assert dtypes.accumulator("bfloat16") == "float64"
    assert float(dtypes.finfo("bfloat16").max) == float(ml_dtypes.finfo(BF16).max)


PROMOTION = {"bool": "bfloat16", "int8": "bfloat16", "uint8": "bfloat16",
             "int16": "float32", "uint16": "float32", "int32": "float64", "int64": "float64",
             "uint32": "float64", "uint64": "float64", "float16": "float32",
             "bfloat16": "bfloat16", "float32": "float32", "float64": "float64"}


@pytest.mark.parametrize("other", sorted(PROMOTION))
def test_promotion_follows_float16s_rule_with_bfloat16_in_its_place(other):
    """JAX's and ml_dtypes' rule for floats; NumPy's float16 rule for integers."""
    x = dx.input("x", (3,), "bfloat16")
    y = dx.input("y", (3,), other)
    assert (x + y).dtype == (y * x).dtype == PROMOTION[other]
    assert (x @ dx.reshape(y, (3, 1))).dtype == PROMOTION[other]
    assert (x < y).dtype == "bool"
    assert dx.where(x > 0, x, y).dtype == PROMOTION[other]
    if other not in ("float16",):  # ml_dtypes' loops agree (it has no float16 promotion)
        assert np.add(np.zeros(1, BF16), np.zeros(1, other)).dtype.name == PROMOTION[other]


def test_python_scalars_and_float_rules_keep_bfloat16():
    x = dx.input("x", (3,), "bfloat16")
    for t in (x + 1.5, x * 2, 2.0 - x, x / 3, x ** 2, dx.exp(x), dx.sigmoid(x), dx.gelu(x),
              dx.erf(x), dx.softmax(x), x.sum(), x.mean(), x.max(), dx.round(x), x.astype(
                  "bfloat16")):
        assert t.dtype == "bfloat16", t
    assert dx.argmax(x).dtype == "int64"
    assert (x.astype("float32") + x).dtype == "float32"


def test_dtype_mistakes_are_graph_errors_naming_the_node():
    with pytest.raises(dx.GraphError, match="node 'x'.*unsupported dtype 'bfloat'"):
        dx.input("x", (3,), "bfloat")
    with pytest.raises(dx.GraphError, match=r"does not fit in bfloat16 \(largest finite value "
                                            r"3\.3895\d*e\+38\)"):
        dx.full((2,), 1e39, "bfloat16")
    x = dx.input("x", (3,), "bfloat16")
    with pytest.raises(dx.GraphError, match="unsupported dtype 'bf16'"):
        x.astype("bf16")
    with pytest.raises(dx.GraphError, match="where: the condition .* must be bool, got "
                                            "bfloat16"):
        dx.where(x, x, x)


# -- through the engine ----------------------------------------------------------------------
IN_FLOAT32 = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "maximum": np.maximum, "minimum": np.minimum, "exp": np.exp, "tanh": np.tanh,
              "neg": np.negative, "abs": np.abs, "sqrt": np.sqrt, "relu": None}
SDK = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
       "div": lambda a, b: a / b, "maximum": dx.maximum, "minimum": dx.minimum,
       "exp": dx.exp, "tanh": dx.tanh, "neg": lambda a: -a, "abs": dx.abs,
       "sqrt": lambda a: dx.sqrt(dx.abs(a)), "relu": dx.relu}


@st.composite
def chains(draw):
    """A random elementwise program over two bfloat16 inputs and a float32 one."""
    steps = []
    for _ in range(draw(st.integers(1, 7))):
        op = draw(st.sampled_from(sorted(SDK)))
        arity = 2 if op in ("add", "sub", "mul", "div", "maximum", "minimum") else 1
        picks = [draw(st.integers(0, len(steps) + 2)) for _ in range(arity)]
        const = draw(st.sampled_from([None, 0.5, -3.0, 1e-3]))
        steps.append((op, picks, const))
    return steps


def run_chain(steps, leaves):
    """The chain on `leaves`: dx tensors (the SDK) or NumPy arrays (the op-by-op reference,
    each step in float32 from widened operands, rounded to its dtype)."""
    values = list(leaves)
    numpy = isinstance(leaves[0], np.ndarray)
    for op, picks, const in steps:
        args = [values[p] for p in picks]
        if const is not None and not numpy:
            args[-1] = args[-1] * const  # a weak scalar: it takes the tensor's dtype
        elif const is not None:
            last = args[-1]
            scalar = to_bfloat16(np.float64(const)) if last.dtype == BF16 else \
                np.float32(const)
            args[-1] = (f32(last) * f32(scalar)).astype(last.dtype)
        if not numpy:
            values.append(SDK[op](*args))
            continue
        dtype = np.float32 if any(a.dtype == np.float32 for a in args) else BF16
        wide = [f32(a) for a in args]
        with np.errstate(all="ignore"):
            if op == "relu":
                value = np.maximum(wide[0], np.float32(0))
            elif op == "sqrt":
                value = np.sqrt(np.abs(wide[0]).astype(args[0].dtype).astype(np.float32))
            else:
                value = IN_FLOAT32[op](*wide)
        values.append(np.asarray(value).astype(dtype))
    return values[-1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains(), st.sampled_from(MEMORIES), st.integers(0, 2**16))
def test_elementwise_programs_round_after_every_bfloat16_operator(steps, memory, seed):
    a, b = bf16_data((48, 40), seed), bf16_data((40,), seed + 1, 3.0)
    c = np.random.default_rng(seed + 2).standard_normal((48, 1)).astype(np.float32)
    leaves = [dx.input("a", a.shape, "bfloat16"), dx.input("b", b.shape, "bfloat16"),
              dx.input("c", c.shape, "float32")]
    out = run_chain(steps, leaves)
    read = {n.id for n in dx.build_graph([out]).nodes if n.op == "input"}
    (got,) = evaluate([out], memory, {k: v for k, v in (("a", a), ("b", b), ("c", c))
                                      if k in read})
    want = np.broadcast_to(run_chain(steps, [a, b, c]), got.shape)
    assert got.dtype == want.dtype
    if want.dtype == BF16:
        assert same(got, np.ascontiguousarray(want))
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("memory", [MEMORIES[0], TINY])
def test_one_operator_is_within_half_a_step_of_float64(memory):
    x = bf16_data((64, 50), 3, 2.0)
    xs = dx.input("x", x.shape, "bfloat16")
    outs = [dx.exp(xs), dx.sigmoid(xs), dx.gelu(xs), dx.erf(xs), xs * 0.1, dx.sqrt(dx.abs(xs))]
    x64 = x.astype(np.float64)
    from scipy import special
    wants = [np.exp(x64), 1 / (1 + np.exp(-x64)),
             0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3))),
             special.erf(x64), x64 * float(to_bfloat16(np.float64(0.1))), np.sqrt(np.abs(x64))]
    # gelu's 1 + tanh cancels for x << 0: float32's own error there, about 1e-7 absolute
    atols = [0, 0, 1e-6, 0, 0, 0]
    for got, want, atol in zip(evaluate(outs, memory, {"x": x}), wants, atols):
        assert got.dtype == BF16
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=HALF_STEP * 1.01,
                                   atol=atol)


@pytest.mark.parametrize("memory", MEMORIES)
def test_sums_and_means_add_up_in_float64_and_round_once(memory):
    x = coarse((120, 70), 4)
    xs = dx.input("x", x.shape, "bfloat16")
    outs = [xs.sum(), xs.sum(axis=0), xs.sum(axis=1, keepdims=True), xs.mean(axis=0),
            xs.mean(), xs.max(axis=1), xs.min(), (xs * 2.0).sum(axis=1)]
    got = evaluate(outs, memory, {"x": x})
    x64 = x.astype(np.float64)
    exact = [x64.sum(), x64.sum(0), x64.sum(1, keepdims=True), x64.sum(0) / 120,
             x64.sum() / x.size]
    for g, w in zip(got, exact):
        assert same(g, to_bfloat16(np.asarray(w)))
    assert same(got[5], x.max(axis=1)) and same(got[6], np.asarray(x.min()))
    assert same(got[7], to_bfloat16((f32(x) * 2).astype(BF16).astype(np.float64).sum(1)))


@pytest.mark.parametrize("memory", MEMORIES)
def test_matmul_computes_in_float32_and_rounds_once(memory):
    """On small integers every float32 sum is exact, whatever the K split: the product is
    the exact one rounded once, and the epilogue sees the rounded product."""
    rng = np.random.default_rng(5)
    a = rng.integers(-8, 9, (60, 90)).astype(BF16)
    w = rng.integers(-8, 9, (90, 30)).astype(BF16)
    bias = (rng.standard_normal(30) * 40).astype(BF16)
    c = rng.standard_normal(30).astype(np.float32)
    xa, xw, xb = (dx.input(n, v.shape, "bfloat16") for n, v in
                  (("a", a), ("w", w), ("b", bias)))
    xc, a32, w32 = dx.input("c", c.shape, "float32"), xa.astype("float32"), \
        xw.astype("float32")
    got_p, got_e, got_f, got_n = evaluate(
        [xa @ xw, dx.relu(xa @ xw + xb), xa @ xw + xc, ((a32 @ w32) / 3.0).astype("bfloat16")],
        memory, {"a": a, "w": w, "b": bias, "c": c})
    exact = a.astype(np.float64) @ w.astype(np.float64)
    product = to_bfloat16(exact)
    assert same(got_p, product)
    want = np.maximum(f32(to_bfloat16(f32(product) + f32(bias))), 0).astype(BF16)
    assert same(got_e, want)
    # a float32 epilogue reads the bfloat16 product; a float32 product is not rounded early
    np.testing.assert_array_equal(got_f, f32(product) + c)
    assert same(got_n, (exact.astype(np.float32) / np.float32(3)).astype(BF16))


@pytest.mark.parametrize("memory", [MEMORIES[0], TINY])
def test_matmul_of_real_data_is_within_bfloat16s_rounding(memory):
    a, w = bf16_data((70, 130), 6), bf16_data((130, 20), 7)
    (got,) = evaluate([dx.input("a", a.shape, "bfloat16") @ dx.input("w", w.shape, "bfloat16")],
                      memory, {"a": a, "w": w})
    exact = a.astype(np.float64) @ w.astype(np.float64)
    bound = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    err = np.abs(got.astype(np.float64) - exact)
    assert got.dtype == BF16
    assert np.all(err <= HALF_STEP * np.abs(exact) + 130 * 2.0**-24 * bound)


@pytest.mark.parametrize("memory", [MEMORIES[0], TINY])
def test_softmax_computes_in_float32_and_rounds_once(memory):
    x = bf16_data((40, 90), 8, 3.0)
    xs = dx.input("x", x.shape, "bfloat16")
    got = evaluate([dx.softmax(xs, axis=1), dx.log_softmax(xs, axis=1),
                    -(dx.softmax(xs, axis=1) * dx.log_softmax(xs, axis=1)).sum(axis=1)],
                   memory, {"x": x})
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    for g, w in zip(got[:2], (p, np.log(p))):
        assert g.dtype == BF16
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=2 * HALF_STEP, atol=1e-7)
    entropy = -(to_bfloat16(p).astype(np.float64) * to_bfloat16(np.log(p)).astype(
        np.float64)).sum(1)
    np.testing.assert_allclose(got[2].astype(np.float64), entropy, rtol=4 * HALF_STEP)


@pytest.mark.parametrize("memory", [MEMORIES[0], TINY])
def test_convolution_and_pooling_compute_in_float32_and_round_once(memory):
    """On integers below 2**8 every float32 sum is exact: the bfloat16 results are the
    float32 ones rounded once, bit for bit, however the images are cut."""
    from deepx_flow.nn import convolution as C
    rng = np.random.default_rng(9)
    x = rng.integers(-20, 21, (6, 3, 9, 9)).astype(BF16)
    k = rng.integers(-8, 9, (4, 3, 3, 3)).astype(BF16)
    xs, ks = dx.input("x", x.shape, "bfloat16"), dx.input("k", k.shape, "bfloat16")
    outs = [C.conv(xs, ks, padding=1), C.max_pool(xs, 2, padding=1), C.avg_pool(xs, 3)]
    wants = [C.conv(xs.astype("float32"), ks.astype("float32"), padding=1),
             C.max_pool(xs.astype("float32"), 2, padding=1),
             C.avg_pool(xs.astype("float32"), 3)]
    got = evaluate(outs + wants, memory, {"x": x, "k": k})
    for g, w in zip(got[:3], got[3:]):
        assert g.dtype == BF16 and same(g, w.astype(BF16))


def test_a_convolutional_network_runs_as_a_batch_chain_in_bfloat16():
    from deepx_flow.nn import convolution as C
    x, k = bf16_data((32, 3, 8, 8), 11), bf16_data((4, 3, 3, 3), 12)
    m = bf16_data((64, 10), 13)

    def net(xs, ks, ms):
        h = C.max_pool(dx.relu(C.conv(xs, ks, padding=1)), 2)
        return dx.reshape(h, (32, 64)) @ ms
    inputs = {"x": x, "k": k, "m": m}
    out = net(*(dx.input(n, v.shape, "bfloat16") for n, v in inputs.items()))
    plan, _ = lowered([out], MEMORIES[0], inputs)
    assert batch_chains(plan.fused, plan.partition)
    (got,) = evaluate([out], MEMORIES[0], inputs)
    # op by op as the tasks compute it: each operator in float32, rounded to bfloat16
    from deepx_flow.kernels import window
    c = window.conv(f32(x), f32(k), {"pads": (1, 1, 1, 1)}).astype(BF16)
    h = window.pool("max_pool", f32(np.maximum(c, BF16.type(0))), {"kernel": (2, 2),
                                                                   "strides": (2, 2)})
    h = f32(h.astype(BF16)).reshape(32, 64)
    want = (h @ f32(m)).astype(BF16)
    # the matmul's float32 sum may round its last bit otherwise in another row block
    scale = np.abs(h) @ np.abs(f32(m))
    assert got.dtype == BF16
    assert np.all(np.abs(f32(got) - f32(want)) <= 2 * HALF_STEP * (np.abs(f32(want)) + 2**-16
                                                                    * scale))


@pytest.mark.parametrize("memory", [MEMORIES[0], TINY])
def test_casts_round_once_and_every_bfloat16_survives_a_round_trip(memory):
    every = np.arange(2**16, dtype=np.uint16).view(BF16)
    xs = dx.input("x", every.shape, "bfloat16")
    w = dx.input("w", (5,), "float64")
    wide = np.array([1 + 2**-8 + 2**-30, -(1 + 3 * 2**-8), 1e300, 2**-140, 0.1])
    got = evaluate([xs.astype("float32").astype("bfloat16"),
                    xs.astype("float64").astype("bfloat16"), w.astype("bfloat16"),
                    xs.astype("float32")], memory, {"x": every, "w": wide})
    assert same(got[0], every) and same(got[1], every)
    assert same(got[2], to_bfloat16(wide)) and float(got[2][0]) == 1 + 2**-7
    np.testing.assert_array_equal(got[3], f32(every))


def test_constants_and_ranges_round_once():
    outs = [dx.full((3,), 1 + 2**-8 + 2**-30, "bfloat16"), dx.arange(0, 2, 0.25, "bfloat16"),
            dx.random.normal((200,), seed=3, dtype="bfloat16"),
            dx.random.uniform((200,), seed=3, low=0.0, high=1.0, dtype="bfloat16")]
    full, ramp, normal, uniform = evaluate(outs, MEMORIES[0])
    assert float(full[0]) == 1 + 2**-7
    assert same(ramp, np.arange(0, 2, 0.25).astype(BF16))
    assert normal.dtype == uniform.dtype == BF16
    u = f32(uniform)
    assert u.min() >= 0 and u.max() < 1
    wide = evaluate([dx.random.normal((200,), seed=3, dtype="float64")], MEMORIES[0])[0]
    assert same(normal, to_bfloat16(wide))  # the same values, rounded once


def test_run_takes_and_returns_bfloat16_arrays(client):
    x = bf16_data((50, 8), 14)
    xs = dx.input("x", x.shape, "bfloat16")
    got, total = dx.run([dx.relu(xs * 2.0), xs.sum()], inputs={"x": x}, client=client)
    assert got.dtype == BF16 and same(got, np.maximum(f32(x) * 2, 0).astype(BF16))
    assert same(total, to_bfloat16(np.asarray(x.astype(np.float64).sum())))
    with pytest.raises(dx.InputError, match="must have dtype bfloat16, but .* float32"):
        dx.run(xs * 2.0, inputs={"x": f32(x)}, client=client)


# -- GPUs ------------------------------------------------------------------------------------
def gpu_cluster() -> ClusterSpec:
    gpu = DeviceSpec("gpu", "NVIDIA H100", 80 * 2**30)
    return ClusterSpec("gpus", (WorkerSpec("g0", "localhost", 1, 64 * 2**30, device=gpu),
                                WorkerSpec("c0", "localhost", 1, 64 * 2**30)))


def test_a_cluster_with_gpus_refuses_bfloat16_naming_the_node():
    """CuPy has no bfloat16: the plan is refused, never run wrongly."""
    x = dx.input("x", (100, 10), "bfloat16")
    with pytest.raises(dx.PlanError, match=r"node 'x' \(input\) is bfloat16, which GPU "
                                           r"workers cannot hold .*GPU workers: g0"):
        compile_graph(dx.build_graph([x.astype("float32") * 2]), gpu_cluster())
    y = dx.input("y", (100, 10), "float32")
    with pytest.raises(dx.PlanError, match="is bfloat16"):
        compile_graph(dx.build_graph([y.astype("bfloat16")]), gpu_cluster())
    compile_graph(dx.build_graph([y * 2]), gpu_cluster())  # others plan as before
    compile_graph(dx.build_graph([x * 2]), cluster_with_memory(2**30))  # CPUs take it


def test_a_bfloat16_array_is_never_moved_to_a_gpu():
    from deepx_flow.kernels import dispatch
    with pytest.raises(dx.ExecutionError, match="CuPy has no bfloat16"):
        dispatch.asarray_on_engine(np.zeros(3, BF16), "cupy")
