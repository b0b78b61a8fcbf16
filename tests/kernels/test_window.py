"""Convolution and pooling (`kernels/window.py`, the `conv`, `max_pool` and `avg_pool`
operators) against references written as plain loops over every output position and kernel
offset in float64, for 1 to 3 spatial axes, strides, pads, dilations and groups; and the
operators through the engine under chunk grids from one chunk to one image per task."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.errors import GraphError
from deepx_flow.kernels import window
from tests.helpers import cluster_with_memory


def out_sizes(shape, kernel, strides, pads, dil):
    n = len(kernel)
    return tuple((shape[2 + a] + pads[a] + pads[n + a] - dil[a] * (kernel[a] - 1) - 1)
                 // strides[a] + 1 for a in range(n))


def positions(x_shape, kernel, strides, pads, dil):
    """(output position, [(input position or None for padding, kernel offset)])."""
    n = len(kernel)
    for o in itertools.product(*[range(s) for s in out_sizes(x_shape, kernel, strides, pads,
                                                              dil)]):
        taps = []
        for k in itertools.product(*[range(s) for s in kernel]):
            at = tuple(o[a] * strides[a] + k[a] * dil[a] - pads[a] for a in range(n))
            inside = all(0 <= at[a] < x_shape[2 + a] for a in range(n))
            taps.append((at if inside else None, k))
        yield o, taps


def ref_conv(x, w, strides, pads, dil, groups):
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // groups, m // groups
    kernel = w.shape[2:]
    out = np.zeros((n, m) + out_sizes(x.shape, kernel, strides, pads, dil))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for o, taps in positions(x.shape, kernel, strides, pads, dil):
        for at, k in taps:
            if at is None:
                continue
            for g in range(groups):
                patch = x64[(slice(None), slice(g * cg, (g + 1) * cg)) + at]  # (n, cg)
                filt = w64[(slice(g * mg, (g + 1) * mg), slice(None)) + k]    # (mg, cg)
                out[(slice(None), slice(g * mg, (g + 1) * mg)) + o] += patch @ filt.T
    return out


def ref_pool(op, x, kernel, strides, pads, dil, include_pad=False):
    out = np.zeros(x.shape[:2] + out_sizes(x.shape, kernel, strides, pads, dil))
    x64 = x.astype(np.float64)
    for o, taps in positions(x.shape, kernel, strides, pads, dil):
        values = [x64[(slice(None), slice(None)) + at] for at, _ in taps if at is not None]
        stacked = np.stack(values)
        if op == "max_pool":
            out[(slice(None), slice(None)) + o] = np.where(
                np.isnan(stacked).any(0), np.nan, stacked.max(0))
        else:
            count = len(taps) if include_pad else len(values)
            out[(slice(None), slice(None)) + o] = stacked.sum(0) / count
    return out


CONV_CASES = [
    # x shape, w shape, strides, pads, dilations, groups
    ((2, 3, 7, 6), (4, 3, 3, 2), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((2, 4, 9, 8), (6, 2, 3, 3), (2, 1), (1, 0, 2, 1), (1, 2), 2),
    ((3, 4, 6, 6), (4, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),   # depthwise
    ((1, 3, 11), (5, 3, 4), (3,), (2, 1), (2,), 1),                   # 1-D
    ((2, 2, 5, 4, 6), (2, 1, 2, 3, 2), (1, 2, 1), (1, 0, 1, 1, 0, 0), (1, 1, 2), 2),  # 3-D
    ((2, 3, 5, 5), (2, 3, 5, 5), (1, 1), (0, 0, 0, 0), (1, 1), 1),   # kernel = image
    # taken directly, tap by tap (`window._direct`): depthwise with a channel multiplier,
    # 5x5 with stride and dilation, and 4 and 5 channels a group (5 takes the GEMMs)
    ((2, 6, 9, 7), (18, 1, 3, 3), (2, 1), (1, 1, 0, 1), (1, 1), 6),
    ((3, 5, 12, 11), (5, 1, 5, 5), (2, 2), (2, 2, 2, 2), (1, 2), 5),
    ((2, 8, 6, 5), (6, 4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    ((2, 10, 6, 5), (4, 5, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("channels_first,out_channels_first", itertools.product(
    [False, True], [False, True]))
def test_the_direct_grouped_kernel_equals_the_gemms_in_every_layout(
        monkeypatch, channels_first, out_channels_first, dtype):
    """A batch chain passes activations channels first; the direct path reads and writes
    either layout as the GEMM path does (the same values, to the dtype's rounding: float16
    adds up in float32 on both paths)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 12, 10, 9)).astype(dtype)
    w = rng.standard_normal((24, 3, 3, 3)).astype(dtype)
    attrs = {"strides": (2, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "groups": 4}
    given = np.ascontiguousarray(x.swapaxes(0, 1)) if channels_first else x
    direct = window.conv(given, w, attrs, {}, channels_first, out_channels_first)
    monkeypatch.setattr(window, "DIRECT_GROUP_CHANNELS", 0)
    gemm = window.conv(given, w, attrs, {}, channels_first, out_channels_first)
    assert direct.shape == gemm.shape and direct.dtype == gemm.dtype == np.dtype(dtype)
    # float16: both round a float32 sum once, so they differ by at most one of its ulps
    tol = 1e-5 if dtype == "float32" else 2.0**-10
    np.testing.assert_allclose(direct.astype(np.float64), gemm.astype(np.float64), rtol=0,
                               atol=tol * np.abs(gemm.astype(np.float64)).max())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"x{c[0]}-w{c[1]}-g{c[5]}")
def test_conv_matches_the_loop_reference(case, dtype):
    xs, ws, strides, pads, dil, groups = case
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    got = window.conv(x, w, {"strides": strides, "pads": pads, "dilations": dil,
                             "groups": groups})
    want = ref_conv(x, w, strides, pads, dil, groups)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    # a sum of C/g x kernel products: the tolerance scales with the sum of their sizes
    scale = ref_conv(np.abs(x), np.abs(w), strides, pads, dil, groups)
    eps = np.finfo(dtype).eps
    assert np.all(np.abs(got - want) <= 8 * eps * (scale + 1e-30))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_pools_match_the_loop_reference(data):
    spatial = data.draw(st.integers(1, 3))
    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(spatial))
    dil = tuple(data.draw(st.integers(1, 2)) for _ in range(spatial))
    strides = tuple(data.draw(st.integers(1, 3)) for _ in range(spatial))
    pads = tuple(data.draw(st.integers(0, (dil[a % spatial] * (kernel[a % spatial] - 1))))
                 for a in range(2 * spatial))
    sizes = tuple(data.draw(st.integers(dil[a] * (kernel[a] - 1) + 1, 7))
                  for a in range(spatial))
    x = np.random.default_rng(data.draw(st.integers(0, 99))).standard_normal(
        (2, 3) + sizes).astype(np.float32)
    if data.draw(st.booleans()):
        x.reshape(-1)[data.draw(st.integers(0, x.size - 1))] = np.nan
    op = data.draw(st.sampled_from(["max_pool", "avg_pool"]))
    include = op == "avg_pool" and data.draw(st.booleans())
    if op == "avg_pool":
        dil = (1,) * spatial
        pads = tuple(min(p, kernel[a % spatial] - 1) for a, p in enumerate(pads))
    got = window.pool(op, x, {"kernel": kernel, "strides": strides, "pads": pads,
                              "dilations": dil, "count_include_pad": int(include)})
    want = ref_pool(op, x, kernel, strides, pads, dil, include)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_integer_max_pool_pads_with_the_lowest_value():
    x = -np.arange(2 * 1 * 4 * 4, dtype=np.int16).reshape(2, 1, 4, 4) - 100
    got = window.pool("max_pool", x, {"kernel": (3, 3), "strides": (1, 1),
                                      "pads": (1, 1, 1, 1), "dilations": (1, 1)})
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, ref_pool("max_pool", x, (3, 3), (1, 1), (1, 1, 1, 1),
                                                (1, 1)).astype(np.int16))


# Budgets giving one chunk, a few images per task, and one image per task.
MEMORIES = (2**30, 200 * 2**10, 60 * 2**10)


def test_a_conv_net_is_the_same_on_every_chunk_grid(client):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((23, 3, 12, 10)).astype(np.float32)
    W1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    B1 = rng.standard_normal(8).astype(np.float32)
    W2 = rng.standard_normal((8, 2, 3, 3)).astype(np.float32) * 0.3
    x, w1, b1, w2 = (dx.input(n, a.shape, "float32") for n, a in
                     (("x", X), ("w1", W1), ("b1", B1), ("w2", W2)))
    h = dx.relu(dx.nn.conv(x, w1, b1, stride=1, padding=1))
    h = dx.nn.max_pool(h, 2)
    h = dx.nn.conv(h, w2, groups=4, padding=(1, 0, 0, 1))
    out = dx.nn.global_avg_pool(dx.nn.avg_pool(h, 2, stride=1, padding=1))
    feed = {"x": X, "w1": W1, "b1": B1, "w2": W2}
    expect = np.maximum(ref_conv(X, W1, (1, 1), (1, 1, 1, 1), (1, 1), 1)
                        + B1.reshape(8, 1, 1), 0)
    expect = ref_pool("max_pool", expect, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1))
    expect = ref_conv(expect, W2, (1, 1), (1, 0, 0, 1), (1, 1), 4)
    expect = ref_pool("avg_pool", expect, (2, 2), (1, 1), (1, 1, 1, 1), (1, 1))
    expect = expect.mean(axis=(2, 3), keepdims=True)
    grids = set()
    for memory in MEMORIES:
        spec = cluster_with_memory(memory)
        grids.add(compile_graph(dx.build_graph(out), spec).chunks[h.node.id])
        got = dx.run(out, inputs=feed, client=client, cluster=spec)
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-5)
    assert len(grids) == 3  # (spatial pieces of images: tests/compiler/test_window_halos.py)


def test_bad_windows_are_named_errors():
    x = dx.input("x", (2, 4, 5, 5), "float32")
    with pytest.raises(GraphError, match="groups 3 must divide"):
        dx.nn.conv(x, dx.input("w", (6, 1, 3, 3), "float32"), groups=3)
    with pytest.raises(GraphError, match="read 2 channels per group"):
        dx.nn.conv(x, dx.input("w2", (6, 2, 3, 3), "float32"))
    with pytest.raises(GraphError, match="does not fit spatial axis 0 of size 5"):
        dx.nn.conv(x, dx.input("w3", (6, 4, 7, 3), "float32"))
    with pytest.raises(GraphError, match="1 to 3 spatial axes"):
        dx.nn.max_pool(dx.input("v", (4, 5), "float32"), 2)
    with pytest.raises(GraphError, match="window of padding only"):
        dx.nn.max_pool(x, 2, padding=2)
    # dilated taps can step over the data: size 1, kernel 2, dilation 3, pads 2 and 2
    with pytest.raises(GraphError, match="position 0 of spatial axis 0 would be a window of "
                                         "padding only"):
        dx.nn.max_pool(dx.input("d", (1, 1, 1), "float32"), 2, stride=1, padding=2,
                       dilation=3)
    with pytest.raises(GraphError, match="defined for floats"):
        dx.nn.avg_pool(dx.input("i", (2, 4, 5, 5), "int32"), 2)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 4), c=st.integers(1, 5), m=st.integers(1, 6),
       size=st.tuples(st.integers(1, 9), st.integers(1, 9)),
       kernel=st.sampled_from([(3, 3), (1, 3), (2, 2), (5, 1)]), dil=st.integers(1, 2),
       pads=st.tuples(*[st.integers(0, 3)] * 4), view_ok=st.booleans(),
       dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 2**16))
def test_stride_one_convs_of_channels_first_blocks_im2col_over_the_padded_grid(
        n, c, m, size, kernel, dil, pads, view_ok, dtype, seed):
    """A chain's 2-D stride-1 convolution (`window._shifted_plan`): the reference's values
    with any padding and dilation, again on the next block with the same buffers; a strided
    view of the result only where the caller takes one."""
    reach = [dil * (k - 1) + 1 for k in kernel]
    if size[0] + pads[0] + pads[2] < reach[0] or size[1] + pads[1] + pads[3] < reach[1]:
        return  # no output position
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, c) + kernel).astype(dtype)
    attrs = {"pads": pads, "dilations": (dil, dil)}
    scratch = {}
    first = rng.standard_normal((n, c) + size).astype(dtype)
    run = window.conv_plan(np.ascontiguousarray(first.swapaxes(0, 1)), w, attrs, scratch,
                           True, True, view_ok=view_ok)
    for x in (first, rng.standard_normal((n, c) + size).astype(dtype)):
        result = run(np.ascontiguousarray(x.swapaxes(0, 1)))
        assert result.flags.c_contiguous or view_ok
        got = result.swapaxes(0, 1)
        want = ref_conv(x.astype(np.float64), w.astype(np.float64), (1, 1), pads, (dil, dil),
                        1)
        scale = ref_conv(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), (1, 1),
                         pads, (dil, dil), 1)
        eps = np.finfo(dtype).eps
        assert got.shape == want.shape
        assert np.all(np.abs(got - want) <= 8 * eps * (scale + 1e-30))
