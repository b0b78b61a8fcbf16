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
