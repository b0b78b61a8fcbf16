"""bfloat16 in ONNX: models with BFLOAT16 inputs, initializers and Casts import and compute
as deepx_flow computes bfloat16 (in float32, rounded once per operator), and exported
graphs with bfloat16 compute the same in ONNX Runtime, whose CPU kernels have no bfloat16
arithmetic (`onnx/export_bfloat16.py`). ONNX's own BFLOAT16 node tests run in
`test_onnx_backend.py`."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.kernels.bfloat16 import to_bfloat16  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


def f32(x):
    return np.asarray(x).astype(np.float32)


def same(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return got.dtype == want.dtype == BF16 and got.shape == want.shape and \
        np.array_equal(got.view(np.uint16), want.view(np.uint16))


def bf16_model(path, w, b):
    """y = relu(x @ W + b) in bfloat16 (W and b initializers), z = y cast to float, and
    d = a double input cast to bfloat16."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["p"]),
             helper.make_node("Add", ["p", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"]),
             helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["wide"], ["d"], to=TensorProto.BFLOAT16)]
    graph = helper.make_graph(
        nodes, "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["N", w.shape[0]]),
         helper.make_tensor_value_info("wide", TensorProto.DOUBLE, [4])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["N", w.shape[1]]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", w.shape[1]]),
         helper.make_tensor_value_info("d", TensorProto.BFLOAT16, [4])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return str(path)


def test_a_bfloat16_model_imports_and_rounds_once_per_operator(client, tmp_path):
    rng = np.random.default_rng(0)
    w = rng.integers(-8, 9, (40, 12)).astype(BF16)
    b = (rng.standard_normal(12) * 30).astype(BF16)
    x = rng.integers(-8, 9, (50, 40)).astype(BF16)
    wide = np.array([1 + 2**-8 + 2**-30, 0.1, -1e300, np.nan])
    model = dx.onnx.load(bf16_model(tmp_path / "bf16.onnx", w, b))
    assert model.input_types["x"] == ((None, 40), "bfloat16")
    assert {a.dtype for a in model.inputs.values()} == {BF16}  # W and b, bound as inputs
    outs = model(x=dx.input("x", x.shape, "bfloat16"), wide=dx.input("wide", (4,), "float64"))
    y, z, d = dx.run([outs["y"], outs["z"], outs["d"]],
                     inputs={**model.inputs, "x": x, "wide": wide}, client=client)
    product = to_bfloat16(x.astype(np.float64) @ w.astype(np.float64))  # exact, rounded once
    want = np.maximum(f32(to_bfloat16(f32(product) + f32(b))), 0).astype(BF16)
    assert same(y, want) and np.array_equal(z, f32(want))
    assert same(d, to_bfloat16(wide)) and float(d[0]) == 1 + 2**-7


def test_an_exported_bfloat16_graph_computes_in_onnx_runtime_as_here(client, tmp_path):
    """Operators on bfloat16 are exported as float32 ones between Casts (sums in float64),
    which ONNX Runtime's CPU kernels run, giving deepx_flow's bits."""
    x = dx.input("x", (30, 20), "float32")
    w = dx.input("w", (20, 8), "float32")
    xb, wb = x.astype("bfloat16"), w.astype("bfloat16")
    outs = {"y": dx.relu(xb @ wb + 1.0).astype("float32"),
            "p": dx.softmax(xb * 2.0, axis=1).astype("float32"),
            "s": xb.sum(axis=1).astype("float32"),
            "m": (dx.maximum(xb, wb.sum() / 7.0) > 0.5).astype("float32")}
    path = str(tmp_path / "bf16.onnx")
    dx.onnx.save(outs, path)
    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    made = [(n.op_type, types.get(o)) for n in model.graph.node for o in n.output]
    assert {op for op, t in made if t == TensorProto.BFLOAT16} == {"Cast", "Constant"}
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((30, 20)).astype(np.float32),
            "w": rng.standard_normal((20, 8)).astype(np.float32)}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    ours = dict(zip(outs, dx.run(list(outs.values()), inputs=feed, client=client)))
    for name in outs:
        np.testing.assert_array_equal(theirs[name], ours[name], err_msg=name)


def test_an_exported_model_keeps_its_bfloat16_signature(client, tmp_path):
    x = dx.input("x", (4, 3), "bfloat16")
    path = str(tmp_path / "sig.onnx")
    dx.onnx.save({"y": dx.exp(x) + x}, path)
    model = onnx.load(path)
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    arithmetic = [n for n in model.graph.node if n.op_type in ("Exp", "Add")]
    assert arithmetic  # ... computed in float32: every operand of them is a Cast's result
    made_by = {o: n.op_type for n in model.graph.node for o in n.output}
    assert all(made_by.get(i) == "Cast" for n in arithmetic for i in n.input)
    back = dx.onnx.load(path)
    xs = np.random.default_rng(2).standard_normal((4, 3)).astype(BF16)
    got = dx.run(back(x=dx.input("x", (4, 3), "bfloat16"))["y"], inputs={"x": xs},
                 client=client)
    want = (f32(np.exp(f32(xs)).astype(BF16)) + f32(xs)).astype(BF16)
    assert same(got, want)
