"""Convolution and pooling of images larger than a task: chunks along the spatial axes, each
task reading the input positions its windows cover, a halo into its neighbours' chunks
(`ops.window.input_window`, the WINDOW lowering).

Checked against the loop references in float64 on budgets that cut one image into several
spatial pieces, and hypothesis over window attributes and budgets."""

import numpy as np
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.errors import PlanError
from deepx_flow.ops.window import input_window, out_size
from tests.compiler.test_inline import evaluate, lowered
from tests.kernels.test_window import ref_conv, ref_pool


def test_one_image_larger_than_a_task_is_computed_in_spatial_pieces():
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((2, 3, 64, 48))
    wv = rng.standard_normal((4, 3, 3, 3))
    x, w = dx.input("x", xv.shape, "float64"), dx.input("w", wv.shape, "float64")
    out = dx.nn.max_pool(dx.nn.relu(dx.nn.conv(x, w, padding=1, stride=(1, 2))), 3,
                         stride=2, padding=1)
    memory = 64 * 2**10  # a task may hold 32 KiB; one input image is 72 KiB
    plan, _ = lowered(out, memory, {"x": xv, "w": wv})
    conv = next(n for n in plan.fused.nodes if n.op == "conv")
    assert plan.chunks[conv.id][0] == (1, 1)
    assert len(plan.chunks[conv.id][2]) > 1  # rows of one image in several tasks
    assert all(r.peak_working_set <= plan.partition.budget for r in plan.stats().nodes)
    (got,) = evaluate(out, memory, {"x": xv, "w": wv})
    c = np.maximum(ref_conv(xv, wv, (1, 2), (1, 1, 1, 1), (1, 1), 1), 0)
    want = ref_pool("max_pool", c, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 40), k=st.integers(1, 4), stride=st.integers(1, 3),
       dilation=st.integers(1, 3), pads=st.tuples(st.integers(0, 3), st.integers(0, 3)),
       cut=st.integers(1, 40), data=st.data())
def test_input_windows_cover_exactly_what_the_outputs_read(size, k, stride, dilation, pads,
                                                           cut, data):
    # Each chunk of output positions reads the span of input positions (and padding) its
    # windows touch, from the first to the last, and makes as many outputs from them.
    assume(size + sum(pads) >= dilation * (k - 1) + 1)
    n = out_size(size, k, stride, pads, dilation)
    lo = data.draw(st.integers(0, n - 1))
    hi = min(n, lo + cut)
    (a, b), (before, after) = input_window((lo, hi), size, k, stride, pads[0], dilation)
    touched = {o * stride - pads[0] + t * dilation for o in range(lo, hi) for t in range(k)}
    inside = sorted(p for p in touched if 0 <= p < size)
    first, last = min(touched), max(touched)
    assert before >= 0 and after >= 0 and before + (b - a) + after == last + 1 - first
    if inside:
        assert a <= inside[0] and inside[-1] < b
        assert a - before == first and b + after == last + 1
    assert out_size(b - a, k, stride, (before, after), dilation) == hi - lo


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["conv", "max_pool", "avg_pool"]), size=st.integers(4, 30),
       k=st.integers(1, 3), stride=st.integers(1, 2), dilation=st.integers(1, 2),
       pad=st.integers(0, 1), include_pad=st.booleans(),
       memory=st.sampled_from([2**30, 32 * 2**10, 12 * 2**10]), seed=st.integers(0, 2**20))
def test_spatial_pieces_equal_numpy(op, size, k, stride, dilation, pad, include_pad, memory,
                                    seed):
    assume(size + 2 * pad >= dilation * (k - 1) + 1 and pad < k)
    if op == "avg_pool":
        dilation = 1
    rng = np.random.default_rng(seed)
    xv = rng.standard_normal((3, 4, size, size + 3))
    x = dx.input("x", xv.shape, "float64")
    inputs = {"x": xv}
    if op == "conv":
        wv = rng.standard_normal((6, 2, k, k))
        inputs["w"] = wv
        out = dx.nn.conv(x, dx.input("w", wv.shape, "float64"), stride=stride,
                         padding=pad, dilation=dilation, groups=2)
        want = ref_conv(xv, wv, (stride,) * 2, (pad,) * 4, (dilation,) * 2, 2)
    elif op == "max_pool":
        out = dx.nn.max_pool(x, k, stride=stride, padding=pad, dilation=dilation)
        want = ref_pool(op, xv, (k, k), (stride,) * 2, (pad,) * 4, (dilation,) * 2)
    else:
        out = dx.nn.avg_pool(x, k, stride=stride, padding=pad, count_include_pad=include_pad)
        want = ref_pool(op, xv, (k, k), (stride,) * 2, (pad,) * 4, (1, 1), include_pad)
    try:
        (got,) = evaluate(out, memory, inputs)
    except PlanError:
        assume(False)  # not even a row of one image fits: refused, by name
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
