"""On CuPy arrays, sums add up in float64 as on NumPy ones (one block: CuPy casts in-kernel).

Skips without CuPy or a visible CUDA device (see conftest.py).
"""

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from deepx_flow.kernels import tasks  # noqa: E402
from tests.helpers import assert_within_ulps, exact_sum  # noqa: E402


def test_a_tall_column_sum_on_the_gpu_is_the_float64_sum_rounded_once():
    x = (1 + np.random.default_rng(0).random((100_000, 3))).astype("float32")
    partial = tasks.reduce_partial("sum", None, (0,), "float64", x.shape, ((),),
                                   cupy.asarray(x))
    assert isinstance(partial, cupy.ndarray) and partial.dtype == cupy.float64
    got = tasks.finish_reduce("sum", (0,), False, x.shape[0], "float32", partial)
    assert_within_ulps(cupy.asnumpy(got), exact_sum(x, 0), 0.5)


def test_the_softmax_normalizer_on_the_gpu_adds_up_in_float64():
    x = np.random.default_rng(1).random((200_000, 2), dtype=np.float32)
    got = cupy.asnumpy(tasks.softmax_chunk("softmax", 0, ((),), cupy.asarray(x)))
    shifted = x.astype(np.float64) - x.max(axis=0)
    assert_within_ulps(got, np.exp(shifted) / exact_sum(np.exp(shifted), 0, keepdims=True), 4)


def test_a_fused_softmax_entropy_on_the_gpu_is_the_cpu_result():
    # A program with whole-axis instructions runs one array operation per instruction there.
    from deepx_flow.ir.program import whole_axis_ref
    x = np.random.default_rng(2).standard_normal((5000, 33)).astype(np.float32)
    prologue = (("softmax", (("in", 0), whole_axis_ref(1)), "float32"),
                ("log_softmax", (("in", 0), whole_axis_ref(1)), "float32"),
                ("mul", (("t", 0), ("t", 1)), "float32"))
    cpu = tasks.reduce_partial("sum", prologue, (1,), "float64", x.shape, ((),), x)
    gpu = tasks.reduce_partial("sum", prologue, (1,), "float64", x.shape, ((),),
                               cupy.asarray(x))
    assert isinstance(gpu, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=1e-5, atol=1e-6)
