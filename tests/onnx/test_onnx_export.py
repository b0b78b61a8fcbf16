"""`dx.onnx.save`: graphs built with the SDK, written as ONNX models and run by ONNX Runtime,
give what deepx_flow computes (`dx.run`) and what NumPy computes in float64; loaded back
with `dx.onnx.load` they give the same again; a trained model is written with its weights
as initializers; what has no ONNX form is one SpecError naming the node, and no file."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import InputError, SpecError  # noqa: E402
from tests import reference as numpy_reference  # noqa: E402

RNG = np.random.default_rng(7)


def runtime(path, feed: dict) -> dict:
    """ONNX Runtime's outputs of the model at `path`, by name."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def reference(build, inputs: dict) -> dict:
    """The outputs of `build("float64")` computed by NumPy in float64, node by node
    (`tests/reference`, and `window` for convolution and pooling)."""
    wide = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    graph = dx.build_graph(build("float64"))
    values: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            args = [values[i] for i in node.inputs]
            value = window(node, *args) if node.op in ("conv", "max_pool", "avg_pool") \
                else numpy_reference._one(node, args, wide)
            values[node.id] = np.asarray(value, dtype=node.dtype)
    return {name: values[node_id] for name, node_id in graph.outputs}


def window(node, x, w=None) -> np.ndarray:
    """conv, max_pool and avg_pool of floats by their definitions (`ops/window.py`): each
    output position reads its window of the padded input (padding is never the maximum and
    is counted in a mean only with count_include_pad)."""
    n = x.ndim - 2
    attrs = dict(node.attrs)
    kernel = w.shape[2:] if node.op == "conv" else attrs["kernel"]
    strides, dilations = attrs.get("strides") or (1,) * n, attrs.get("dilations") or (1,) * n
    pads = attrs.get("pads") or (0,) * (2 * n)
    widths = [(pads[a], pads[n + a]) for a in range(n)]
    padded = np.pad(x, [(0, 0), (0, 0)] + widths,
                    constant_values=-np.inf if node.op == "max_pool" else 0.0)
    inside = np.pad(np.ones(x.shape[2:]), widths)
    out = np.zeros(node.shape)
    for pos in np.ndindex(*node.shape[2:]):
        index = tuple(slice(p * s, p * s + d * (k - 1) + 1, d)
                      for p, s, d, k in zip(pos, strides, dilations, kernel))
        patch = padded[(slice(None), slice(None)) + index]
        at = (slice(None), slice(None)) + pos
        spatial = tuple(range(2, 2 + n))
        if node.op == "max_pool":
            out[at] = patch.max(axis=spatial)
        elif node.op == "avg_pool":
            count = patch[0, 0].size if attrs.get("count_include_pad") else inside[index].sum()
            out[at] = patch.sum(axis=spatial) / count
        else:
            groups = attrs.get("groups", 1)
            cg, mg = x.shape[1] // groups, w.shape[0] // groups
            for g in range(groups):
                taken = range(1, x.ndim)  # the group's channels and the kernel's offsets
                out[(slice(None), slice(g * mg, (g + 1) * mg)) + pos] = np.tensordot(
                    patch[:, g * cg:(g + 1) * cg], w[g * mg:(g + 1) * mg], (taken, taken))
    return out


def close(got, want, rtol=1e-5):
    """Within `rtol` relative and an absolute `rtol` of the output's scale (float32 sums
    added in another order); float16 results within 2e-3 (two of its ulps)."""
    if np.asarray(got).dtype == np.float16:
        rtol = max(rtol, 2e-3)
    scale = float(np.abs(want).max()) if np.size(want) else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(scale, 1e-30))


def check_all(build, inputs: dict, feed: dict, path, client, dynamic=None, rtol=1e-5,
              reference_rtol=2e-5, opset=None) -> dict:
    """Save `build("float32")` with the arrays of `inputs` bound, run it with ONNX Runtime
    on `feed`: each output equals dx.run's (same dtype, within `rtol`) and NumPy's float64
    one (within `reference_rtol`). Returns ONNX Runtime's outputs."""
    outputs = build("float32")
    used = {n.id for n in dx.build_graph(outputs).inputs}
    inputs = {k: v for k, v in inputs.items() if k in used}
    feed = {k: v for k, v in feed.items() if k in used}
    written = dx.onnx.save(outputs, path, inputs=inputs, dynamic_axes=dynamic, opset=opset)
    assert written == str(path)
    got = runtime(path, feed)
    names = list(outputs)
    ours = dict(zip(names, dx.run([outputs[n] for n in names], inputs={**inputs, **feed},
                                  client=client)))
    want = reference(build, {**inputs, **feed})
    assert set(got) == set(names)
    for name in names:
        assert got[name].dtype == ours[name].dtype, name
        assert got[name].shape == ours[name].shape, name
        if got[name].dtype.kind in "biu":
            np.testing.assert_array_equal(got[name], ours[name], err_msg=name)
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        else:
            close(got[name], ours[name], rtol)
            close(got[name], want[name], reference_rtol)
    return got


# -- models --------------------------------------------------------------------------------
F, H, C = 20, 16, 5
MLP_WEIGHTS = {"w1": RNG.standard_normal((F, H)).astype(np.float32) / 4,
               "b1": RNG.standard_normal(H).astype(np.float32),
               "w2": RNG.standard_normal((H, C)).astype(np.float32) / 4,
               "b2": RNG.standard_normal(C).astype(np.float32)}


def mlp(batch: int):
    def build(dtype):
        x = dx.input("x", (batch, F), dtype)
        w1, b1, w2, b2 = (dx.input(n, a.shape, dtype) for n, a in MLP_WEIGHTS.items())
        logits = dx.relu(x @ w1 + b1) @ w2 + b2
        return {"logits": logits, "probs": dx.softmax(logits, axis=1)}
    return build


CNN_WEIGHTS = {"k1": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) / 3,
               "c1": RNG.standard_normal(4).astype(np.float32) / 3,
               "k2": RNG.standard_normal((6, 2, 3, 3)).astype(np.float32) / 3,
               "c2": RNG.standard_normal(6).astype(np.float32) / 3,
               "w": RNG.standard_normal((54, C)).astype(np.float32) / 5,
               "b": RNG.standard_normal(C).astype(np.float32)}


def cnn(batch: int):
    """conv (bias, padding) -> relu -> max_pool -> grouped strided conv -> relu ->
    avg_pool (padding, counted or not) -> flatten -> matmul -> log_softmax."""
    def build(dtype):
        x = dx.input("images", (batch, 3, 12, 12), dtype)
        k1, c1, k2, c2, w, b = (dx.input(n, a.shape, dtype) for n, a in CNN_WEIGHTS.items())
        h = dx.relu(dx.nn.conv(x, k1, c1, padding=1))                      # (N, 4, 12, 12)
        h = dx.nn.max_pool(h, 2)                                           # (N, 4, 6, 6)
        h = dx.relu(dx.nn.conv(h, k2, c2, padding=(1, 2, 1, 0), groups=2))  # (N, 6, 6, 7)
        pooled = dx.nn.avg_pool(h, (2, 3), stride=2, padding=(0, 1, 0, 0))  # (N, 6, 3, 3)
        counted = dx.nn.avg_pool(h, 2, stride=(2, 3), padding=1, count_include_pad=True)
        padded_max = dx.nn.max_pool(h, 3, stride=2, padding=1, dilation=(1, 2))
        logits = pooled.reshape(batch, 54) @ w + b
        return {"logits": logits, "log_probs": dx.log_softmax(logits, axis=1),
                "counted": counted, "padded_max": padded_max}
    return build


# -- ONNX Runtime = dx.run = NumPy float64 ---------------------------------------------------
def test_an_mlp_with_softmax_and_a_dynamic_batch(client, tmp_path):
    x = RNG.standard_normal((64, F)).astype(np.float32)
    path = tmp_path / "mlp.onnx"
    check_all(mlp(64), MLP_WEIGHTS, {"x": x}, path, client, dynamic={"x": {0: "N"}})
    model = onnx.load(str(path))
    graph = model.graph
    assert [i.name for i in graph.input] == ["x"]
    assert [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] \
        == ["N", F]
    assert [d.dim_param or d.dim_value for d in graph.output[1].type.tensor_type.shape.dim] \
        == ["N", C]
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for name, array in MLP_WEIGHTS.items():
        np.testing.assert_array_equal(initializers[name], array)
    assert model.opset_import[0].version == 18
    # the batch axis takes any size: 7 rows against NumPy's float64 answer for 7 rows
    few = RNG.standard_normal((7, F)).astype(np.float32)
    got = runtime(path, {"x": few})
    want = reference(mlp(7), {**MLP_WEIGHTS, "x": few})
    close(got["probs"], want["probs"], 2e-5)
    close(got["logits"], want["logits"], 2e-5)


def test_a_small_cnn(client, tmp_path):
    images = RNG.standard_normal((5, 3, 12, 12)).astype(np.float32)
    path = tmp_path / "cnn.onnx"
    check_all(cnn(5), CNN_WEIGHTS, {"images": images}, path, client,
              dynamic={"images": {0: "batch"}}, rtol=2e-5, reference_rtol=5e-5)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Conv", "Relu", "MaxPool", "AveragePool", "Reshape", "MatMul", "LogSoftmax"} <= ops
    more = RNG.standard_normal((9, 3, 12, 12)).astype(np.float32)
    got = runtime(path, {"images": more})
    want = reference(cnn(9), {**CNN_WEIGHTS, "images": more})
    for name in ("logits", "counted", "padded_max"):
        close(got[name], want[name], 5e-5)


def layout(dtype):
    x = dx.input("x", (4, 6, 5), dtype)
    ids = dx.input("ids", (3, 2), "int32")
    return {
        "transposed": dx.transpose(x, (2, 0, 1)),
        "reshaped": x.reshape(8, 15),
        "sliced": x[1:, ::2, 1:5:3],
        "stepped": x[::3, 1::4],
        "joined": dx.concat([x, x * 2.0, x[:, :2]], axis=1),
        "taken": dx.take(x, ids, axis=1),
        "padded": dx.pad(x, [(1, 2), (0, 0), (2, 1)], value=-1.5),
        "reflected": dx.pad(x, [(0, 0), (2, 1), (1, 3)], mode="reflect"),
        "edged": dx.pad(x, 2, mode="edge"),
        "wrapped": dx.pad(x, [(1, 1), (0, 0), (3, 0)], mode="wrap"),
        "running": dx.cumsum(x, axis=1),
        "running_back": dx.cumsum(x, axis=2, exclusive=True, reverse=True),
        "ranged": x + dx.arange(0.5, 3.0, 0.5, dtype=dtype),
        "counted": dx.arange(2, 20, 3, dtype="int32") * 2,
        "filled": x * dx.full((6, 1), 0.25, dtype) + dx.ones((5,), dtype),
        "scalar": dx.full((), 3, dtype="int16"),
        "picked": x[2, :, 3],
        "batched": dx.relu(x) @ x.transpose(0, 2, 1) @ x[0],
    }


def test_layout_operators(client, tmp_path):
    x = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    ids = np.array([[0, 5], [-1, 2], [3, 3]], dtype=np.int32)
    got = check_all(layout, {}, {"x": x, "ids": ids}, tmp_path / "layout.onnx", client)
    np.testing.assert_array_equal(got["taken"], np.take(x, ids, axis=1))
    np.testing.assert_array_equal(got["wrapped"], np.pad(x, [(1, 1), (0, 0), (3, 0)],
                                                          mode="wrap"))
    np.testing.assert_array_equal(got["sliced"], x[1:, ::2, 1:5:3])


def reductions(dtype):
    x = dx.input("x", (3, 4, 5), dtype)
    k = dx.input("k", (3, 4), "int32")
    return {
        "sum_kept": x.sum(axis=(0, 2), keepdims=True),
        "mean": x.mean(axis=1),
        "max_all": x.max(),
        "min_kept": x.min(axis=-1, keepdims=True),
        "sum_all_kept": x.sum(keepdims=True),
        "int_sum": k.sum(axis=1),                       # int64, as NumPy
        "int_mean": k.mean(axis=0, keepdims=True),      # float64, as NumPy
        "int_max": k.max(axis=0),
        "count": (x > 0).sum(axis=2),                   # bools counted as int64
        "any": (x > 1).max(axis=(1, 2)),               # bool max: any
        "argmax": x.argmax(axis=1),
        "argmin_kept": x.argmin(axis=2, keepdims=True),
        "argmax_flat": x.argmax(),
        "softmax0": dx.softmax(x, axis=0),
        "log_softmax": dx.log_softmax(x, axis=2),
    }


def test_the_newest_opset_is_written_and_checked(tmp_path):
    newest = onnx.defs.onnx_opset_version()
    path = dx.onnx.save(layout("float32"), tmp_path / "newest.onnx", opset=newest)
    model = onnx.load(path)
    assert model.opset_import[0].version == newest
    onnx.checker.check_model(model, full_check=True)


def test_the_model_file_gets_the_mode_the_umask_gives(tmp_path):
    old = os.umask(0o022)
    try:
        path = dx.onnx.save(layout("float32"), tmp_path / "shared.onnx")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644  # readable by others, as files are
    assert [p.name for p in tmp_path.iterdir()] == ["shared.onnx"]  # no temporary left


@pytest.mark.parametrize("opset", [13, 18, 21])
def test_reductions_with_keepdims_at_several_opsets(client, tmp_path, opset):
    """opset 13 takes ReduceMean/Max/Min's axes as an attribute, 18 and later as an input."""
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    k = RNG.integers(-50, 50, (3, 4)).astype(np.int32)
    path = tmp_path / "reduce.onnx"
    check_all(reductions, {}, {"x": x, "k": k}, path, client, opset=opset)
    assert onnx.load(str(path)).opset_import[0].version == opset


def logic(dtype):
    a = dx.input("a", (4, 5), dtype)
    b = dx.input("b", (5,), dtype)
    i = dx.input("i", (4, 5), "int32")
    positive = a > 0
    return {
        "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": i == 3, "ne": i != 3,
        "mixed_eq": a == i,                              # float32 vs int32: float64
        "bool_lt": positive < (b > 0),                   # False < True
        "bool_and_or": positive * (i > 0) + (a < -1),    # logical and, or
        "where": dx.where(a > b, a, b * 2.0),
        "where_mixed": dx.where(positive, a, i),        # float64, as NumPy
        "where_scalar": dx.where(i > 0, i, 0),
        "to_int": dx.cast(a * 10.0, "int32"),            # truncated toward zero
        "to_half": dx.cast(i, "float16"),
        "to_float": dx.cast(positive, dtype),
        "to_bool": dx.cast(i, "bool"),
        "int_plus_float": i + a,                         # float64
        "int_div": i / 7,                               # true division: float64
        "int_ops": dx.abs(i) + dx.relu(-i) * dx.maximum(i, 2) - dx.minimum(i, -4),
        "int_neg_floor": -dx.floor(i),
        "int_pow": dx.abs(i) ** 2,
        "signs": dx.sign(a) + dx.floor(a * 3.0) + dx.ceil(a) + dx.round(a * 4.0),
        "clipped": dx.clip(a, -0.5, 0.5),
        "math": dx.exp(a) + dx.log(dx.abs(a) + 1.0) + dx.sqrt(dx.abs(b)) + dx.tanh(a)
        + dx.sigmoid(a) + dx.sin(a) * dx.cos(b) + dx.tan(a * 0.5) + dx.softplus(a)
        + dx.reciprocal(dx.abs(a) + 1.0) + dx.gelu(a) + a ** 2.0 - a / (b * b + 1.0)
        + dx.sinh(a) + dx.cosh(b) + dx.asinh(a) + dx.acosh(dx.abs(b) + 1.0)
        + dx.atanh(dx.tanh(a)),
        "erf": dx.erf(a),
        "int_exp": dx.exp(dx.cast(i, "int8") * 0) + dx.sigmoid(dx.cast(i, "float16")),
    }


def test_comparisons_where_and_cast(client, tmp_path):
    a = RNG.standard_normal((4, 5)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    i = RNG.integers(-6, 7, (4, 5)).astype(np.int32)
    a[0, :2] = b[:2]                       # ties for le, ge
    a[1, 0] = 3.0                          # equal to an int
    i[1, 0] = 3
    check_all(logic, {}, {"a": a, "b": b, "i": i}, tmp_path / "logic.onnx", client)


def test_inputs_that_share_a_dynamic_axis(client, tmp_path):
    """Token ids (N, L) and a weight per sample (N, 1), both of any N: an embedding lookup,
    a mean over the tokens, a product with the weights; two symbols that meet are refused."""
    table = RNG.standard_normal((10, 4)).astype(np.float32)

    def build(batch):
        ids = dx.input("ids", (batch, 3), "int64")
        weight = dx.input("weight", (batch, 1), "float32")
        embedded = dx.nn.Embedding(10, 4)({"weight": dx.input("table", (10, 4))}, ids)
        return {"pooled": embedded.mean(axis=1) * weight}

    path = tmp_path / "embed.onnx"
    dynamic = {"ids": {0: "N"}, "weight": {0: "N"}}
    dx.onnx.save(build(2), path, inputs={"table": table}, dynamic_axes=dynamic)
    ids = RNG.integers(0, 10, (6, 3))
    weight = RNG.standard_normal((6, 1)).astype(np.float32)
    got = runtime(path, {"ids": ids, "weight": weight})["pooled"]
    close(got, table[ids].astype(np.float64).mean(axis=1) * weight)
    close(got, dx.run(build(6)["pooled"], inputs={"ids": ids, "weight": weight,
                                                  "table": table}, client=client))
    with pytest.raises(SpecError, match="mul fixes a dynamic axis: axis 0 joins dynamic axes "
                                        "B, N"):
        dx.onnx.save(build(2), path, inputs={"table": table},
                     dynamic_axes={"ids": {0: "N"}, "weight": {0: "B"}})
    with pytest.raises(SpecError, match=r"operand 'weight' has a fixed size 2 on axis 0, which "
                                        r"is dynamic \(N\)"):
        dx.onnx.save(build(2), path, inputs={"table": table}, dynamic_axes={"ids": {0: "N"}})


# -- round trip ----------------------------------------------------------------------------
def test_load_of_save_gives_the_same_results(client, tmp_path):
    x = RNG.standard_normal((6, 3, 12, 12)).astype(np.float32)
    outputs = cnn(6)("float32")
    path = dx.onnx.save(outputs, tmp_path / "cnn.onnx", inputs=CNN_WEIGHTS,
                        dynamic_axes={"images": {0: "N"}})
    model = dx.onnx.load(path)
    assert model.input_names == ["images"]
    assert model.input_types["images"] == ((None, 3, 12, 12), "float32")
    assert model.output_names == list(outputs)
    back = model(images=dx.input("images", x.shape, "float32"))
    again = dx.run([back[n] for n in outputs],
                   inputs={**model.inputs_for(list(back.values())), "images": x}, client=client)
    first = dx.run(list(outputs.values()), inputs={**CNN_WEIGHTS, "images": x}, client=client)
    for name, got, want in zip(outputs, again, first):
        close(got, want, 1e-6)
    # a layout graph, whose integer constants fold when loaded
    feed = {"x": RNG.standard_normal((4, 6, 5)).astype(np.float32),
            "ids": np.array([[1, 2], [0, -2], [4, 4]], dtype=np.int32)}
    outputs = layout("float32")
    model = dx.onnx.load(dx.onnx.save(outputs, tmp_path / "layout.onnx"))
    back = model({n: dx.input(n, a.shape, a.dtype.name) for n, a in feed.items()})
    again = dx.run([back[n] for n in outputs], inputs={**model.inputs_for(list(back.values())),
                                                       **feed}, client=client)
    first = dx.run(list(outputs.values()), inputs=feed, client=client)
    for name, got, want in zip(outputs, again, first):
        assert got.dtype == want.dtype, name
        close(got, want, 1e-6)


# -- random elementwise and reduction graphs -------------------------------------------------
UNARY = {"neg": dx.neg, "abs": dx.abs, "tanh": dx.tanh, "sigmoid": dx.sigmoid,
         "relu": dx.relu, "sin": dx.sin, "cos": dx.cos, "softplus": dx.softplus,
         "gelu": dx.gelu, "exp_small": lambda t: dx.exp(dx.tanh(t)),
         "log1": lambda t: dx.log(dx.abs(t) + 1.0), "sqrt1": lambda t: dx.sqrt(dx.abs(t))}
BINARY = {"add": dx.add, "sub": dx.sub, "mul": dx.mul, "maximum": dx.maximum,
          "minimum": dx.minimum, "div1": lambda p, q: p / (q * q + 1.0),
          "where": lambda p, q: dx.where(p > q, p, q * 0.5)}
REDUCTIONS = ("sum", "mean", "prod", "max", "min")


@st.composite
def programs(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    other = tuple(s if draw(st.booleans()) else 1
                  for s in shape[len(shape) - draw(st.integers(0, len(shape))):])
    steps = draw(st.lists(st.tuples(st.sampled_from(sorted(UNARY) + sorted(BINARY)),
                                    st.booleans()), min_size=1, max_size=6))
    reduce = draw(st.sampled_from(REDUCTIONS))
    axes = draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    keep = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return shape, other, steps, reduce, tuple(sorted(axes)) or None, keep, seed


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=programs())
def test_random_elementwise_and_reduction_graphs(client, tmp_path, program):
    shape, other, steps, reduce, axes, keep, seed = program

    def build(dtype):
        x, y = dx.input("x", shape, dtype), dx.input("y", other, dtype)
        t = x
        for op, swap in steps:
            if op in UNARY:
                t = UNARY[op](t)
            else:
                t = BINARY[op](y, t) if swap else BINARY[op](t, y)
        return {"elementwise": t, "reduced": getattr(dx, reduce)(t, axis=axes, keepdims=keep)}

    rng = np.random.default_rng(seed)
    feed = {"x": rng.standard_normal(shape).astype(np.float32),
            "y": rng.standard_normal(other).astype(np.float32)}
    check_all(build, {}, feed, tmp_path / f"random{seed}.onnx", client, rtol=1e-5,
              reference_rtol=1e-4)


# -- a trained model -----------------------------------------------------------------------
def test_a_trained_model_is_written_with_its_weights_as_initializers(client, tmp_path):
    n, features, classes = 120, 4, 3
    rng = np.random.default_rng(11)
    centres = rng.standard_normal((classes, features)) * 3
    labels = rng.integers(0, classes, n)
    data = (centres[labels] + rng.standard_normal((n, features))).astype(np.float32)
    model = dx.nn.Sequential(dx.nn.Linear(features, 8), dx.nn.tanh, dx.nn.Linear(8, classes))
    fit = dx.train(lambda p, x, y: dx.nn.cross_entropy(model(p, x), y), model.init(seed=3),
                   data=(data, labels), batch_size=40, epochs=8,
                   optimizer=dx.optim.SGD(lr=0.3), progress=False, client=client)
    assert fit.history[-1]["loss"] < fit.history[0]["loss"]
    x = dx.input("x", (n, features), "float32")
    probs = dx.softmax(model(fit.params, x), axis=1)
    path = dx.onnx.save({"probs": probs}, tmp_path / "trained.onnx", inputs=fit.inputs,
                        dynamic_axes={"x": {0: "N"}})
    proto = onnx.load(path)
    stored = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for name, array in fit.inputs.items():
        np.testing.assert_array_equal(stored[name], array)
    assert [i.name for i in proto.graph.input] == ["x"]
    got = runtime(path, {"x": data})["probs"]
    ours = dx.run(probs, inputs={**fit.inputs, "x": data}, client=client)
    close(got, ours)
    v = {k: a.astype(np.float64) for k, a in fit.values.items()}
    z = np.tanh(data.astype(np.float64) @ v["0.weight"] + v["0.bias"]) @ v["2.weight"] \
        + v["2.bias"]
    want = np.exp(z - z.max(1, keepdims=True))
    close(got, want / want.sum(1, keepdims=True), 2e-5)
    assert (got.argmax(1) == labels).mean() > 0.8


# -- refusals ------------------------------------------------------------------------------
def test_every_operator_is_exported_or_refused_by_name():
    from deepx_flow.onnx.export_ops import EXPORTERS, REFUSED
    from deepx_flow.ops import OPS
    assert set(OPS) - {"input"} <= set(EXPORTERS) | set(REFUSED)


def test_random_sources_are_initializers_holding_deepx_flows_values(client, tmp_path):
    """ONNX's RandomNormal would draw other values: the model holds the tensor deepx_flow
    computes, bit for bit, in its dtype (bfloat16 too), and computes what dx.run does."""
    x = dx.input("x", (4, 3), "float32")
    noise = dx.random.normal((4, 3), seed=1, std=0.5)
    scale = dx.random.uniform((3,), seed=2, low=1.0, high=2.0)
    half = dx.random.normal((2, 5), seed=3, dtype="bfloat16")
    # ONNX Runtime hands no bfloat16 back to NumPy: that output is widened (exactly).
    outputs = {"y": (x + noise) * scale, "half": (half * 2.0).astype("float32")}
    path = tmp_path / "model.onnx"
    dx.onnx.save(outputs, path)
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["x"]
    held = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    drawn = dx.run([noise, scale, half], client=client)
    for value in drawn:
        [same] = [a for a in held.values() if a.shape == value.shape and a.dtype == value.dtype]
        np.testing.assert_array_equal(same.view(np.uint8), value.view(np.uint8))
    xs = RNG.standard_normal((4, 3)).astype(np.float32)
    got = runtime(path, {"x": xs})
    ours = dx.run(outputs, inputs={"x": xs}, client=client)
    np.testing.assert_array_equal(got["y"], ours["y"])  # one add and one multiply: exact
    np.testing.assert_array_equal(got["half"], ours["half"])


def test_a_random_source_past_two_gib_is_refused_before_it_is_drawn(tmp_path):
    huge = dx.random.normal((2**16, 2**14), seed=1)  # 4 GiB of float32
    with pytest.raises(SpecError, match=rf"node '{huge.node.id}': random_normal has no ONNX "
                                        r"export here: .* 4\.0 GiB"):
        dx.onnx.save(huge.sum(), tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_other_refusals_are_named(tmp_path):
    from deepx_flow.compiler.fuse import fuse_elementwise
    x = dx.input("x", (8, 3), "float32")
    w = dx.input("w", (3, 2), "float32")
    y = dx.relu(x @ w + 1.0)
    fused = fuse_elementwise(dx.build_graph({"y": y}))
    with pytest.raises(SpecError, match="the graph was compiled"):
        dx.onnx.save(fused, tmp_path / "a.onnx")
    with pytest.raises(InputError, match="unknown input.*'v'.*the graph's inputs are 'x', 'w'"):
        dx.onnx.save(y, tmp_path / "a.onnx", inputs={"v": np.ones(3)})
    with pytest.raises(InputError, match="must have dtype float32.*float64"):
        dx.onnx.save(y, tmp_path / "a.onnx", inputs={"w": np.ones((3, 2))})
    with pytest.raises(InputError, match=r"must have shape \(3, 2\)"):
        dx.onnx.save(y, tmp_path / "a.onnx", inputs={"w": np.ones((2, 3), np.float32)})
    with pytest.raises(SpecError, match="opset 12 is not supported"):
        dx.onnx.save(y, tmp_path / "a.onnx", opset=12)
    with pytest.raises(InputError, match="'w' is bound in inputs"):
        dx.onnx.save(y, tmp_path / "a.onnx", inputs={"w": np.ones((3, 2), np.float32)},
                     dynamic_axes={"w": {0: "K"}})
    with pytest.raises(InputError, match="folder .* does not exist"):
        dx.onnx.save(y, tmp_path / "no" / "a.onnx")
    # nodes that would fix a dynamic axis
    pad = dx.pad(x, [(0, 0), (1, 1)])
    with pytest.raises(SpecError, match=r"concat fixes a dynamic axis: .* fixed size 8 on "
                                        "axis 0"):
        dx.onnx.save(pad, tmp_path / "a.onnx", dynamic_axes={"x": {0: "N"}})
    flat = x.reshape(24)
    with pytest.raises(SpecError, match=rf"node '{flat.node.id}': reshape fixes a dynamic axis"):
        dx.onnx.save(flat, tmp_path / "a.onnx", dynamic_axes={"x": {0: "N"}})
    with pytest.raises(SpecError, match="slices dynamic axis 0"):
        dx.onnx.save(x[1:], tmp_path / "a.onnx", dynamic_axes={"x": {0: "N"}})
    assert list(tmp_path.iterdir()) == []


# -- the command line ----------------------------------------------------------------------
SPEC = """
deepx: 1
name: tiny_mlp
inputs:
  x: {shape: [10, 4], dtype: float32}
  w: {shape: [4, 3], dtype: float32}
nodes:
  - {id: xw, op: matmul, args: [x, w]}
  - {id: h, op: relu, args: [xw]}
  - {id: probs, op: softmax, args: [h], attrs: {axis: 1}}
  - {id: total, op: sum, args: [h], attrs: {axes: [1], keepdims: true}}
outputs: [probs, total]
"""


def test_the_export_command(tmp_path, capsys):
    from deepx_flow.cli.main import main
    (tmp_path / "g.yaml").write_text(SPEC)
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    out = tmp_path / "g.onnx"
    assert main(["onnx", "export", str(tmp_path / "g.yaml"), str(out), "--input",
                 f"w={tmp_path / 'w.npy'}", "--dynamic-axis", "x:0:N"]) == 0
    assert "1 initializers, outputs probs, total" in capsys.readouterr().out
    x = RNG.standard_normal((13, 4)).astype(np.float32)
    got = runtime(out, {"x": x})
    h = np.maximum(x.astype(np.float64) @ w, 0)
    close(got["total"], h.sum(1, keepdims=True))
    close(got["probs"], np.exp(h) / np.exp(h).sum(1, keepdims=True))


def test_the_mlp_spec_with_random_weights_exports_and_computes_as_here(client, tmp_path,
                                                                      capsys):
    """`deepx-flow onnx export graphs/mlp_forward.yaml` (its weights are random_normal
    nodes): ONNX Runtime's outputs equal deepx_flow's run of the spec. The batch axis is
    dynamic, so both run 64 rows (the spec's copy with 64 rows has the same weights: they
    depend on the seed and the element's index only)."""
    from pathlib import Path

    from deepx_flow.cli.main import main
    spec = Path(__file__).resolve().parents[2] / "graphs" / "mlp_forward.yaml"
    out = tmp_path / "mlp.onnx"
    assert main(["onnx", "export", str(spec), str(out), "--dynamic-axis", "x:0:N"]) == 0
    assert "2 initializers (2 random), outputs y, probs" in capsys.readouterr().out
    rows = 64
    small = tmp_path / "mlp64.yaml"
    small.write_text(spec.read_text().replace("200000", str(rows)))
    x = RNG.standard_normal((rows, 512)).astype(np.float32)
    got = runtime(out, {"x": x})
    ours = dx.run(dx.from_yaml(small), inputs={"x": x}, client=client)
    w = dx.run(dx.random.normal((512, 1024), seed=0), client=client).astype(np.float64)
    size = (np.abs(x.astype(np.float64)) @ np.abs(w) + 1.0).sum(axis=1)  # float32 sums:
    np.testing.assert_allclose(got["y"], ours["y"], rtol=0, atol=1e-5 * size.max())
    np.testing.assert_allclose(got["probs"], ours["probs"], rtol=0, atol=1e-5)
    assert got["probs"].shape == (rows, 10) and got["y"].shape == (rows,)


def test_the_export_command_refuses_bad_input_with_exit_code_2(tmp_path, capsys):
    from deepx_flow.cli.main import main
    bad = SPEC.replace("{id: xw, op: matmul, args: [x, w]}",
                       "{id: stored, op: read_zarr, shape: [10, 4], dtype: float32, "
                       "attrs: {uri: data.zarr}}\n  - {id: xn, op: add, args: [x, stored]}\n"
                       "  - {id: xw, op: matmul, args: [xn, w]}")
    (tmp_path / "bad.yaml").write_text(bad)
    out = tmp_path / "bad.onnx"
    assert main(["onnx", "export", str(tmp_path / "bad.yaml"), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node 'stored': read_zarr cannot be exported" in err
    assert not out.exists()
    assert main(["onnx", "export", str(tmp_path / "missing.yaml"), str(out)]) == 2
    assert "no such graph spec file" in capsys.readouterr().err
    (tmp_path / "g.yaml").write_text(SPEC)
    assert main(["onnx", "export", str(tmp_path / "g.yaml"), str(out), "--dynamic-axis",
                 "x:first"]) == 2
    assert "--dynamic-axis expects NAME:AXIS:SYMBOL" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "g.yaml"]
