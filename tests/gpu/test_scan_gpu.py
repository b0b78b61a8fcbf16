"""The scan kernels on CuPy blocks give the NumPy kernels' results: every dtype, axis and
flag, with and without a carry, across several of CuPy's blocks along and across the axis;
float sums in float64, rounded once; and a chunked plan's tasks (totals, carries, scans)
run on CuPy chunks give NumPy's cumsum.

Skips without CuPy or a visible CUDA device (see conftest.py).
"""

import itertools

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from deepx_flow.kernels import scan, tasks  # noqa: E402
from tests.reference import cumsum as reference  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int8", "bool"])
def test_a_chunk_scanned_on_the_gpu_is_the_cpu_result(dtype):
    rng = np.random.default_rng(0)
    for shape, axis in (((7, 300), 1), ((300, 7), 0), ((3, 50, 4), 1), ((2, 3000), 0)):
        x = rng.standard_normal(shape) * 20
        x = (x > 0) if dtype == "bool" else x.astype(dtype)
        out_dtype = np.cumsum(x[..., :1]).dtype.name
        acc = "float64" if out_dtype.startswith("float") else out_dtype
        cross = list(shape)
        cross[axis] = 1
        carry = (rng.standard_normal(cross) * 20).round().astype(acc)
        for exclusive, reverse, c in itertools.product((False, True), (False, True),
                                                       (None, carry)):
            cpu = scan.scan(x, axis, exclusive, reverse, out_dtype, c)
            gpu = scan.scan(cupy.asarray(x), axis, exclusive, reverse, out_dtype,
                            None if c is None else cupy.asarray(c))
            assert isinstance(gpu, cupy.ndarray) and gpu.dtype == cpu.dtype
            if out_dtype.startswith("float"):
                # both the float64 sums rounded once; float64 sums in another order
                np.testing.assert_allclose(cupy.asnumpy(gpu), cpu, rtol=1e-12,
                                           atol=1e-12 * float(np.abs(cpu).max()))
            else:
                np.testing.assert_array_equal(cupy.asnumpy(gpu), cpu)


def test_blocks_along_the_axis_carry_their_running_sums_on_the_gpu():
    """A line longer than a CuPy block is scanned in several, the running sum carried."""
    n = scan.GPU_BLOCK_ELEMENTS * 2 + 5
    x = np.ones((1, n), np.float32)
    got = scan.scan(cupy.asarray(x), 1, False, False, "float32")
    np.testing.assert_array_equal(cupy.asnumpy(got)[0, [0, n // 2, n - 1]],
                                  [1.0, n // 2 + 1, n])


def test_a_plans_tasks_on_gpu_chunks_give_numpy_s_cumsum():
    """The lowered tasks, each fed CuPy chunks: the totals (float64), the carry chain and the
    scans with their carries."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 900)).astype(np.float32)
    pieces = np.split(x, 3, axis=1)
    totals = [tasks.scan_total(1, "float64", ((),), cupy.asarray(p)) for p in pieces]
    carries = [None, totals[0], tasks.combine_partials("sum", totals[0], totals[1])]
    out = [tasks.scan_chunk(1, False, False, "float32", ((),), cupy.asarray(p),
                            *([] if c is None else [c]))
           for p, c in zip(pieces, carries)]
    got = np.concatenate([cupy.asnumpy(o) for o in out], axis=1)
    want = reference(x, 1)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=2e-7,
                               atol=2e-7 * float(np.abs(want).max()))
