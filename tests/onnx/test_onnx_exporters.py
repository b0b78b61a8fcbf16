"""Models as other people's exporters write them (issue 31): the patterns PyTorch, Paddle2ONNX
and TensorFlow's converters emit that a model built here never does. Each model is built
with `onnx.helper` as the exporter writes it and compared with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.meta.db import close_all  # noqa: E402

INT64_MIN = np.iinfo(np.int64).min


def _model(path, nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n)
                               for n, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, str(path))
    return str(path)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _runtime(path, feed):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def test_resize_to_sizes_and_scales_computed_from_the_input_shape(client, tmp_path):
    """PyTorch's F.interpolate(size=2 * H) and Paddle's upsampling: Shape, Gather, Cast to
    float, Mul, Cast back, Concat, then Resize; the scales form divides float sizes."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "two", "four"], ["hw"]),
        helper.make_node("Cast", ["hw"], ["hw_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["hw_f", "factor"], ["big_f"]),
        helper.make_node("Floor", ["big_f"], ["big_floor"]),
        helper.make_node("Cast", ["big_floor"], ["big"], to=TensorProto.INT64),
        helper.make_node("Slice", ["shape", "zero", "two"], ["nc"]),
        helper.make_node("Concat", ["nc", "big"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["by_sizes"], mode="nearest"),
        # scales: the wanted size (a float computed from the shape) over the input's
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["shape_f", "per_axis"], ["wanted"]),
        helper.make_node("Div", ["wanted", "shape_f"], ["scales"]),
        helper.make_node("Resize", ["x", "", "scales"], ["by_scales"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
    ]
    constants = [("two", np.array([2])), ("four", np.array([4])), ("zero", np.array([0])),
                 ("factor", np.array([2.0, 1.5], np.float32)),
                 ("per_axis", np.array([1.0, 1.0, 1.5, 2.0], np.float32))]
    path = _model(tmp_path / "resize.onnx", nodes, [_vi("x", [2, 3, 4, 5])],
                  [_vi("by_sizes", [2, 3, 8, 7]), _vi("by_scales", [2, 3, 6, 10])], constants)
    want = _runtime(path, {"x": x})
    model = dx.onnx.load(path)
    outs = model(x=dx.input("x", x.shape, "float32"))
    got = dx.run([outs["by_sizes"], outs["by_scales"]], inputs={"x": x}, client=client)
    assert got[0].shape == want[0].shape == (2, 3, 8, 7)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].shape == want[1].shape == (2, 3, 6, 10)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_an_input_dimension_stored_as_minus_one_is_symbolic(client, tmp_path):
    """Some exporters write a dynamic batch as dim_value -1 (the error used to read
    `float32(-1, 3, ?, ?)`)."""
    x_info = _vi("x", [-1, 3, None, None])
    path = _model(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])], [x_info],
                  [_vi("y", [-1, 3, None, None])])
    model = dx.onnx.load(path)
    assert model.input_types["x"] == ((None, 3, None, None), "float32")
    x = np.random.default_rng(1).standard_normal((5, 3, 2, 4)).astype(np.float32)
    got = dx.run(model(x=dx.input("x", x.shape, "float32"))["y"], inputs={"x": x},
                 client=client)
    np.testing.assert_array_equal(got, _runtime(path, {"x": x})[0])



@pytest.mark.parametrize("starts,ends,axes,steps", [
    ((-1,), (INT64_MIN,), (0,), (-1,)),        # x[::-1], as PyTorch and Paddle write it
    ((4, -2), (0, 1), (0, 1), (-2, -3)),
    ((100, 2), (-100, 6), (1, 0), (-1, 1)),    # clamped to the axis, as ONNX says
    ((5,), (5,), (0,), (-1,))])                 # empty
def test_slices_with_negative_steps_equal_onnx_runtime(client, tmp_path, starts, ends, axes,
                                                       steps):
    x = np.arange(6 * 7, dtype=np.float32).reshape(6, 7)
    constants = [(n, np.array(v, np.int64)) for n, v in
                 (("s", starts), ("e", ends), ("a", axes), ("st", steps))]
    node = helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])
    (want,) = _runtime(_model(tmp_path / "probe.onnx", [node], [_vi("x", [6, 7])],
                              [_vi("y", None)], constants), {"x": x})
    path = _model(tmp_path / "slice.onnx", [node], [_vi("x", [6, 7])],
                  [_vi("y", list(want.shape))], constants)
    out = dx.onnx.load(path)(x=dx.input("x", (6, 7), "float32"))["y"]
    np.testing.assert_array_equal(dx.run(out, inputs={"x": x}, client=client), want)


# -- item 1: weights travel with the graph ---------------------------------------------------
def _mlp(path):
    rng = np.random.default_rng(7)
    w1, b1 = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal(8, np.float32)
    w2 = rng.standard_normal((8, 3)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("HardSwish", ["hb"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"])]
    return _model(path, nodes, [_vi("x", ["N", 6])], [_vi("y", ["N", 3])],
                  [("w1", w1), ("b1", b1), ("w2", w2)])


def test_a_models_outputs_run_persist_export_and_materialize_without_its_weights_named(
        client, tmp_path, monkeypatch):
    """`dx.run(model(x=x)["y"])`: no `inputs=model.inputs`, no 'onnx_const_...' the user
    never saw; persist, an asset and an export just work; passing them keeps working."""
    path = _mlp(tmp_path / "mlp.onnx")
    x = np.random.default_rng(8).standard_normal((50, 6)).astype(np.float32)
    (want,) = _runtime(path, {"x": x})
    model = dx.onnx.load(path)
    y = model(x=dx.input("x", x.shape, "float32"))["y"]
    np.testing.assert_allclose(dx.run(y, inputs={"x": x}, client=client), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
    again = dx.run(y, inputs={**model.inputs, "x": x}, client=client)
    np.testing.assert_array_equal(again, dx.run(y, inputs={"x": x}, client=client))
    persisted = dx.persist(y, inputs={"x": x}, client=client)
    np.testing.assert_array_equal(persisted.to_numpy(), again)
    saved = dx.onnx.save({"y": y}, tmp_path / "again.onnx", dynamic_axes={"x": {0: "N"}})
    (back,) = _runtime(saved, {"x": x})
    np.testing.assert_allclose(back, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    monkeypatch.setenv("DEEPX_DB_URL", f"sqlite:///{(tmp_path / 'deepx.db').as_posix()}")
    monkeypatch.setenv("DEEPX_ASSET_ROOT", str(tmp_path / "assets"))
    import zarr
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(20, 6))

    @dx.asset
    def scores():
        return model(x=dx.read_zarr(str(tmp_path / "x.zarr")))["y"]

    try:
        dx.materialize(dx.Definitions(assets=[scores]), client=client)
        np.testing.assert_array_equal(dx.run(dx.load("scores"), client=client), again)
    finally:
        close_all()
