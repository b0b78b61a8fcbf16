"""Convolution, pooling and batch chains on CuPy arrays equal the NumPy kernels."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from deepx_flow.kernels import batch_chain, window  # noqa: E402


def test_conv_and_pools_on_the_device_equal_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((70, 4, 9, 8)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    attrs = {"strides": (2, 1), "pads": (1, 1, 0, 1), "groups": 2}
    np.testing.assert_allclose(cp.asnumpy(window.conv(cp.asarray(x), cp.asarray(w), attrs)),
                               window.conv(x, w, attrs), rtol=1e-5, atol=1e-5)
    pool = {"kernel": (3, 2), "strides": (2, 2), "pads": (1, 0, 1, 1)}
    for op in ("max_pool", "avg_pool"):
        np.testing.assert_allclose(cp.asnumpy(window.pool(op, cp.asarray(x), pool)),
                                   window.pool(op, x, pool), rtol=1e-6, atol=1e-6)


def test_a_batch_chain_on_the_device_equals_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 1, 12, 12)).astype(np.float32)
    w1 = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    b1 = rng.standard_normal((4, 1, 1)).astype(np.float32)
    w2 = rng.standard_normal((64, 3)).astype(np.float32)
    relu_add = (("add", (("in", 0), ("in", 1)), "float32"), ("relu", (("t", 0),), "float32"))
    # (description, where each operand comes from): the images, earlier stages, wholes
    stages = ((("window", "conv", {"pads": (1, 1, 1, 1)}), (("image", 0), ("whole", 0))),
              (("fused", relu_add, (1,)), (("stage", 0), ("whole", 1))),
              (("window", "max_pool", {"kernel": (3, 3), "strides": (3, 3)}), (("stage", 1),)),
              (("reshape", (64,)), (("stage", 2),)),
              (("matmul", None, "float32"), (("stage", 3), ("whole", 2))))
    want = batch_chain.batch_chain(stages, 8, 1, x, w1, b1, w2)
    got = batch_chain.batch_chain(stages, 8, 1, *map(cp.asarray, (x, w1, b1, w2)))
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-5, atol=1e-5)


def test_a_branching_batch_chain_on_the_device_equals_numpy():
    """A region that branches and joins (a value read by two stages, a global mean, a
    per-image scale): the device's values are freed after their last reader and give
    NumPy's results."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((20, 3, 10, 10)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    relu = (("relu", (("in", 0),), "float32"),)
    add = (("add", (("in", 0), ("in", 1)), "float32"),)
    mul = (("mul", (("in", 0), ("in", 1)), "float32"),)
    stages = ((("window", "conv", {"pads": (1, 1, 1, 1)}), (("image", 0), ("whole", 0))),
              (("fused", relu, None), (("stage", 0),)),
              (("fused", add, None), (("stage", 0), ("stage", 1))),
              (("reduce", "mean", None, (2, 3), "float64", 100, "float32"), (("stage", 2),)),
              (("fused", mul, None), (("stage", 2), ("stage", 3))))
    want = batch_chain.batch_chain(stages, 8, 1, x, w)
    got = batch_chain.batch_chain(stages, 8, 1, cp.asarray(x), cp.asarray(w))
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-5, atol=1e-5)
