"""`dx.onnx.save` with dynamic axes, on graphs as other exporters and the SDK's composites
build them (issue 31, item 6): a Squeeze or Reshape of a leading 1 that the batch axis only
passes through, a transposed convolution (which the SDK lowers to a spread, a slice and a
convolution), and refusals that say where the refused node lies in the user's names."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import SpecError  # noqa: E402

RNG = np.random.default_rng(11)


def _runtime(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def test_dropping_and_adding_axes_of_one_around_a_dynamic_axis(tmp_path):
    """(1, N, 3) -> (N, 3) as a reshape and as x[0]; (N, 3) -> (N, 1, 3, 1); written as
    Squeeze and Unsqueeze, they run for any N."""
    x = dx.input("x", (1, 5, 3), "float32")
    outs = {"reshaped": dx.reshape(x, (5, 3)) * 2.0, "indexed": x[0] + 1.0,
            "widened": dx.reshape(x, (5, 1, 3, 1)) - 1.0}
    path = dx.onnx.save(outs, tmp_path / "squeeze.onnx", dynamic_axes={"x": {1: "N"}})
    for n in (5, 2, 9):
        a = RNG.standard_normal((1, n, 3)).astype(np.float32)
        reshaped, indexed, widened = _runtime(path, {"x": a})
        np.testing.assert_array_equal(reshaped, a[0] * 2.0)
        np.testing.assert_array_equal(indexed, a[0] + 1.0)
        np.testing.assert_array_equal(widened, a[0][:, None, :, None] - 1.0)


def test_an_imported_squeeze_of_a_leading_one_exports_with_its_batch_dynamic(tmp_path,
                                                                              client):
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Squeeze", ["x", "zero"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.array([0], np.int64), "zero")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "in.onnx"))
    model = dx.onnx.load(tmp_path / "in.onnx")
    y = model(x=dx.input("x", (1, 6, 4), "float32"))["y"]
    out = dx.onnx.save({"y": y}, tmp_path / "out.onnx", dynamic_axes={"x": {1: "N"}})
    for n in (6, 3):
        a = RNG.standard_normal((1, n, 4)).astype(np.float32)
        (got,) = _runtime(out, {"x": a})
        np.testing.assert_array_equal(got, np.maximum(a[0], 0))


@pytest.mark.parametrize("stride,padding,output_padding", [(2, 0, 0), (2, 1, 1), (3, 2, 0)])
def test_a_transposed_convolution_exports_with_a_dynamic_batch(tmp_path, client, stride,
                                                                padding, output_padding):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    x = dx.input("x", (2, 4, 6, 5), "float32")
    y = dx.nn.conv_transpose(x, w, b, stride=stride, padding=padding,
                             output_padding=output_padding)
    path = dx.onnx.save({"y": y}, tmp_path / "ct.onnx", dynamic_axes={"x": {0: "N"}})
    for n in (2, 5):
        a = RNG.standard_normal((n, 4, 6, 5)).astype(np.float32)
        (got,) = _runtime(path, {"x": a})
        want = dx.run(dx.nn.conv_transpose(dx.input("x", a.shape, "float32"), w, b,
                                           stride=stride, padding=padding,
                                           output_padding=output_padding),
                      inputs={"x": a}, client=client)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_refusal_says_which_input_and_output_the_node_lies_between(tmp_path):
    x = dx.input("x", (2, 5, 3), "float32")
    scores = dx.reshape(x, (10, 3)) * 2.0
    with pytest.raises(SpecError, match=r"moves dynamic axis 1 \(N\).*between graph input "
                                        r"'x' \(axis 1, N\) and output 'scores'"):
        dx.onnx.save({"scores": scores}, tmp_path / "no.onnx", dynamic_axes={"x": {1: "N"}})
    assert not (tmp_path / "no.onnx").exists()
