"""The cost model counts what the kernels hold: float32 sums keep float64 partials."""

import pytest

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from tests.helpers import cluster_with_memory


@pytest.mark.parametrize("reduce, itemsize", [
    (lambda x: x.sum(axis=0), 8), (lambda x: x.mean(axis=0), 8),
    (lambda x: x.astype("float16").sum(axis=0), 8), (lambda x: x.max(axis=0), 4),
    (lambda x: x.astype("int32").sum(axis=0), 8)])  # int32 sums are int64 (NumPy's rule)
def test_partial_results_are_counted_in_the_accumulator_dtype(reduce, itemsize):
    x = dx.input("x", (1000, 64), "float32")
    plan = compile_graph(dx.build_graph(reduce(x)), cluster_with_memory(2**30))
    partials = plan.stats().nodes[-1]
    assert partials.op.split()[0] in ("sum", "mean", "max")  # "sum of cast(in0)" when fused
    assert partials.bytes_out == 64 * itemsize  # one chunk: one partial of 64 elements


def test_a_fused_softmax_along_a_long_axis_counts_its_chunk_sized_temporaries():
    # Blocks keep a softmax's axis and every axis after it whole: along axis 0 of a chunk,
    # that is the whole chunk, for every temporary and the normalizer's buffers.
    import tracemalloc

    import numpy as np

    from deepx_flow.compiler import costs
    from deepx_flow.ir.program import whole_axis_ref
    from deepx_flow.kernels import fused_cpu, tasks
    assert costs.BLOCK_ELEMENTS == fused_cpu.BLOCK_ELEMENTS
    prologue = (("softmax", (("in", 0), whole_axis_ref(0)), "float32"),
                ("log_softmax", (("in", 0), whole_axis_ref(0)), "float32"),
                ("mul", (("t", 0), ("t", 1)), "float32"))
    chunk = (2048, 512)
    assert costs.whole_axis_scratch(prologue, chunk) >= 8 * 2048 * 512 * 4
    assert costs.whole_axis_scratch(prologue, (2048, 64)) == 0  # fits a block: reused
    assert costs.whole_axis_scratch(((
        "softmax", (("in", 0), whole_axis_ref(1)), "float32"),), chunk) == 0
    x = np.random.default_rng(0).standard_normal(chunk).astype(np.float32)
    tracemalloc.start()
    try:
        tasks.reduce_partial("sum", prologue, (0,), "float64", chunk, [()], x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= costs.whole_axis_scratch(prologue, chunk)
