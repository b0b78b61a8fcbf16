"""Batch norms folded into the convolutions before them on loading (deepx_flow/onnx/fold.py):
the folded model equals ONNX Runtime on the file as written, and a pair is left as it is
where folding would not be the same computation."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402

RNG = np.random.default_rng(21)


def _model(path, extra_reader=False, training=False, bias=True):
    w = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    params = {"w": w, "b": RNG.standard_normal(6).astype(np.float32),
              "gamma": RNG.uniform(0.5, 2, 6).astype(np.float32),
              "beta": RNG.standard_normal(6).astype(np.float32),
              "mean": RNG.standard_normal(6).astype(np.float32),
              "var": RNG.uniform(0.1, 3, 6).astype(np.float32)}
    conv_inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"],
                              ["y"], epsilon=1e-3, training_mode=int(training), name="bn")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 5, 5])]
    if extra_reader:  # the convolution's output is read by another node too
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 6, 5, 5]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 5])],
        outputs, [numpy_helper.from_array(a, n) for n, a in params.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]),
              str(path))
    return str(path)


@pytest.mark.parametrize("extra_reader,bias,folded", [(False, True, True), (False, False, True),
                                                     (True, True, False)])
def test_a_folded_pair_equals_onnx_runtime(client, tmp_path, extra_reader, bias, folded):
    path = _model(tmp_path / "m.onnx", extra_reader=extra_reader, bias=bias)
    model = dx.onnx.load(path)
    assert ("BatchNormalization" not in model.ops) == folded
    x = RNG.standard_normal((4, 3, 5, 5)).astype(np.float32)
    outs = model(x=dx.input("x", x.shape, "float32"))
    got = dx.run([outs[n] for n in model.output_names], inputs={"x": x}, client=client)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())
    assert set(model.inputs_for(list(outs.values()))) == set(model.inputs)  # none left over
