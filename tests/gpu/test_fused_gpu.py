"""fused_gpu on a real device: generated kernels against NumPy float64 references."""

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from deepx_flow.kernels import dispatch, fused, fused_cpu, fused_gpu  # noqa: E402
from deepx_flow.kernels.random import random_chunk  # noqa: E402
from tests.kernels.cases import (CHAIN10, ALL_CASES, assert_matches, case_id,  # noqa: E402
                                 fused as one_op, operands, reference)

pytestmark = pytest.mark.gpu


def test_dispatch_sees_the_device():
    x = cupy.zeros(3)
    assert dispatch.device_engine() == "cupy"
    assert dispatch.array_module(np.zeros(2), x) is cupy
    assert isinstance(dispatch.to_host(x), np.ndarray)
    assert isinstance(dispatch.asarray_on_engine(np.zeros(2), "cupy"), cupy.ndarray)


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_every_operator_matches_reference(case):
    op, ins, r = case
    shapes = [(3, 17), (17,), (3, 1)][:len(ins)]
    arrays = [operands(op, ins, s, seed=i)[i] for i, s in enumerate(shapes)]
    got = fused_gpu.evaluate(one_op(op, len(ins), r), [cupy.asarray(a) for a in arrays],
                             (3, 17))
    assert isinstance(got, cupy.ndarray)
    # CUDA's float32 math is within 4 ulp (5e-7 relative): inside the float32 tolerance
    assert_matches(got.get(), reference(op, arrays, r), r, what=case_id(case))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_maximum_minimum_relu_nan_rules(dtype):
    a = np.array([np.nan, 1, np.nan, -np.inf, np.inf, 0.0, 2, -1], dtype=dtype)
    b = np.array([1, np.nan, np.nan, 2, -np.inf, -0.0, 2, np.nan], dtype=dtype)
    ga, gb = cupy.asarray(a), cupy.asarray(b)
    for op, want in (("maximum", np.maximum(a, b)), ("minimum", np.minimum(a, b))):
        got = fused.evaluate(((op, (("in", 0), ("in", 1)), dtype),), [ga, gb], a.shape)
        np.testing.assert_array_equal(got.get(), want)
    got = fused.evaluate((("relu", (("in", 0),), dtype),), [ga], a.shape)
    np.testing.assert_array_equal(got.get(), np.maximum(a, 0))


def test_ten_op_chain_and_broadcast_output():
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (64, 33)).astype(np.float32)
    y = rng.uniform(-2, 2, (33,)).astype(np.float32)
    want = fused_cpu.evaluate_blocked(CHAIN10, [x, y], (5, 64, 33))
    got = fused.evaluate(CHAIN10, [cupy.asarray(x), cupy.asarray(y)], (5, 64, 33))
    assert got.shape == (5, 64, 33) and got.dtype == np.float32
    np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=1e-6)


def test_constants_and_mixed_host_inputs():
    c = ("c", 16777217.0, "float32")
    program = (("add", (("in", 0), c), "float32"), ("sub", (("t", 0), c), "float32"))
    got = fused.evaluate(program, [cupy.ones(4, np.float32)], (4,))
    np.testing.assert_array_equal(got.get(), np.zeros(4, np.float32))
    nan = (("div", (("in", 0), ("in", 1)), "float64"),
           ("add", (("t", 0), ("c", float("nan"), "float64")), "float64"))
    got = fused.evaluate(nan, [cupy.ones(3), np.ones(3)], (3,))  # a NumPy input is copied
    assert bool(cupy.isnan(got).all())
    only_consts = (("mul", (("c", 3, "int32"), ("c", 4, "int32")), "int32"),)
    got = fused_gpu.evaluate(only_consts, [], (2, 2))
    np.testing.assert_array_equal(got.get(), np.full((2, 2), 12, np.int32))


@pytest.mark.parametrize("op", ["random_normal", "random_uniform"])
def test_random_chunks_match_numpy(op):
    shape, region = (300, 70), ((10, 250), (3, 70))
    for dtype in ("float32", "float64"):
        host = random_chunk(op, 11, {}, shape, region, dtype)
        dev = random_chunk(op, 11, {}, shape, region, dtype, xp=cupy)
        assert isinstance(dev, cupy.ndarray) and dev.dtype == np.dtype(dtype)
        if op == "random_uniform":
            np.testing.assert_array_equal(dev.get(), host)  # integer hash and exact scaling
        else:  # log, sqrt and cos of CUDA and the host libm may differ in the last bit
            np.testing.assert_allclose(dev.get(), host, rtol=1e-6 if dtype == "float32"
                                       else 1e-13, atol=1e-13)


@pytest.mark.parametrize("kind,n", [("maximum", 24), ("mix", 2000)])
def test_long_chains_compile_and_match_numpy(kind, n):
    # the CUDA source is one statement per instruction (tests/kernels/test_kernel_code_size);
    # here NVRTC compiles such kernels and they compute what NumPy does
    from tests.kernels.test_kernel_code_size import N_INPUTS, chain, inputs
    from tests.kernels.test_kernel_fused_cpu import plain_numpy
    program = chain(kind, n)
    arrays = inputs()
    want = plain_numpy(program, arrays)
    got = fused.evaluate(program, [cupy.asarray(a) for a in arrays], want.shape)
    assert len(arrays) == N_INPUTS
    np.testing.assert_allclose(got.get(), want, rtol=1e-10, atol=1e-12)
