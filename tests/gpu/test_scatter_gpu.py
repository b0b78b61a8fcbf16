"""The scatter and element-gather kernels on CuPy blocks give the NumPy kernels' results:
every reduction (cupyx's atomics, the host for a product), the last update of a repeated
index, and an index out of range named.

Skips without CuPy or a visible CUDA device (see conftest.py).
"""

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from deepx_flow.errors import ExecutionError  # noqa: E402
from deepx_flow.kernels import scatter  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_on_the_gpu_is_the_cpu_result(reduction, dtype):
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, size=(50, 7)).astype(dtype)
    indices = rng.integers(-50, 50, size=(300, 6))  # many repeats
    updates = rng.integers(-3, 4, size=(300, 6)).astype(dtype)
    cpu = scatter.scatter_elements(x, indices, updates, 0, reduction)
    gpu = scatter.scatter_elements(cupy.asarray(x), cupy.asarray(indices),
                                   cupy.asarray(updates), 0, reduction)
    assert isinstance(gpu, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(gpu), cpu)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_and_the_gathers_on_the_gpu_are_the_cpu_results(reduction):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 4, 5))
    rows = rng.integers(-9, 9, size=(20, 1))
    updates = rng.standard_normal((20, 4, 5))
    g = [cupy.asarray(a) for a in (x, rows, updates)]
    np.testing.assert_array_equal(cupy.asnumpy(scatter.scatter_nd(*g, reduction)),
                                  scatter.scatter_nd(x, rows, updates, reduction))
    np.testing.assert_array_equal(cupy.asnumpy(scatter.gather_nd(g[0], g[1])),
                                  scatter.gather_nd(x, rows))
    index = rng.integers(-9, 9, size=(6, 4, 5))
    np.testing.assert_array_equal(
        cupy.asnumpy(scatter.gather_elements(g[0], cupy.asarray(index), 0)),
        scatter.gather_elements(x, index, 0))


def test_an_index_out_of_range_on_the_gpu_is_named():
    x = cupy.zeros((3, 4))
    with pytest.raises(ExecutionError, match="index 3 is out of range for axis 0 of size 3"):
        scatter.scatter_elements(x, cupy.asarray([[0, 3]]), cupy.ones((1, 2)), 0, "add")
