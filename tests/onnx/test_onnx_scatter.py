"""Scatters and element gathers across ONNX: exported models give ONNX Runtime's results
(repeated indices included), reductions older opsets lack are refused by name, and on import
a scatter of integer constants (a shape being edited) is folded while the graph is built.
ONNX's own ScatterElements and ScatterND node tests run in test_onnx_backend."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import SpecError  # noqa: E402


def runtime(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return dict(zip([o.name for o in session.get_outputs()],
                    session.run(None, {n: feed[n] for n in names})))


def test_exported_scatters_give_onnx_runtimes_results(client, tmp_path):
    rng = np.random.default_rng(1)
    values = {"x": rng.standard_normal((4, 5)).astype(np.float32),
              "i": rng.integers(-4, 4, size=(6, 5)),  # 6 rows into 4: repeats
              "u": rng.standard_normal((6, 5)).astype(np.float32),
              "rows": rng.integers(-4, 4, size=(7, 1)),
              "blocks": rng.standard_normal((7, 5)).astype(np.float32)}
    t = {k: dx.input(k, v.shape, v.dtype.name) for k, v in values.items()}
    outputs = {f"put_{r}": dx.scatter(t["x"], t["i"], t["u"], axis=0, reduction=r)
               for r in ("none", "add", "mul", "max", "min")}
    outputs["put_nd"] = dx.scatter_nd(t["x"], t["rows"], t["blocks"])
    outputs["add_nd"] = dx.scatter_nd(t["x"], t["rows"], t["blocks"], reduction="add")
    outputs["picked"] = dx.take_along_axis(t["x"], dx.cast(t["i"], "int32"), axis=0)
    outputs["gathered"] = dx.gather_nd(t["x"], t["rows"])
    path = tmp_path / "scatter.onnx"
    dx.onnx.save(outputs, path)
    theirs = runtime(path, values)
    ours = dx.run(outputs, inputs=values, client=client)
    for name in outputs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def test_a_reduction_older_opsets_lack_is_refused_by_name(tmp_path):
    x = dx.input("x", (4, 3), "float32")
    y = dx.scatter(x, dx.input("i", (2, 3), "int64"), dx.input("u", (2, 3), "float32"),
                   reduction="max")
    with pytest.raises(SpecError, match=rf"node '{y.node.id}': scatter_elements has no ONNX "
                                        "export here: reduction 'max' comes to ONNX's "
                                        "scatters in opset 18"):
        dx.onnx.save(y, tmp_path / "m.onnx", opset=16)
    assert not (tmp_path / "m.onnx").exists()


def _model(path, nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(a, n) for n, a in initializers])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
              str(path))
    return path


def test_a_scatter_of_constant_shapes_is_folded_on_import(client, tmp_path):
    # ScatterND edits a shape vector; Reshape needs it as a constant while building.
    path = _model(tmp_path / "fold.onnx", [
        helper.make_node("ScatterND", ["shape0", "at", "size"], ["shape"], name="edit"),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])],
        [("shape0", np.array([2, 0], np.int64)), ("at", np.array([[1]], np.int64)),
         ("size", np.array([12], np.int64))])
    model = dx.onnx.load(path)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y = model({"x": dx.input("x", (2, 3, 4), "float32")})["y"]
    np.testing.assert_array_equal(dx.run(y, inputs={"x": x}, client=client),
                                  x.reshape(2, 12))


def test_malformed_scatters_are_refused_naming_the_onnx_node(tmp_path):
    consts = [("data", np.zeros(4, np.int64)), ("at", np.array([4], np.int64)),
              ("one", np.array([1], np.int64))]
    out = [helper.make_tensor_value_info("y", TensorProto.INT64, [4])]
    path = _model(tmp_path / "range.onnx", [
        helper.make_node("ScatterElements", ["data", "at", "one"], ["y"], name="bump")],
        [], out, consts)
    with pytest.raises(SpecError, match="bump.*scatter_elements: index 4 is out of range for "
                                        "axis 0 of size 4"):
        dx.onnx.load(path)({})
    path = _model(tmp_path / "reduction.onnx", [
        helper.make_node("ScatterElements", ["data", "at", "one"], ["y"], name="bump",
                         reduction="sum")], [], out, consts)
    with pytest.raises(SpecError, match="bump.*reduction 'sum' is not one of none, add"):
        dx.onnx.load(path)({})


def test_an_element_gathers_index_out_of_range_fails_the_run(client, tmp_path):
    # Flat positions once read x[1, 0] here for row 0's index 3 into an axis of size 3.
    path = _model(tmp_path / "ge.onnx", [
        helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1, name="pick")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [3, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])], opset=13)
    model = dx.onnx.load(path)
    y = model({"x": dx.input("x", (3, 3), "float32"), "i": dx.input("i", (3, 1), "int64")})["y"]
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_array_equal(
        dx.run(y, inputs={"x": x, "i": np.array([[2], [0], [-1]])}, client=client),
        [[2.0], [3.0], [8.0]])
    with pytest.raises(dx.ExecutionError, match="gather_elements: index 3 is out of range for "
                                                "axis 1 of size 3"):
        dx.run(y, inputs={"x": x, "i": np.array([[3], [0], [0]])}, client=client)


def test_gather_nd_with_batch_axes_checks_every_index(client, tmp_path):
    # With batch_dims 1, flat positions once read the next batch's row for an index past
    # its axis; each index is now checked against its own axis.
    path = _model(tmp_path / "gnd.onnx", [
        helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1, name="rows")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2, 4])], opset=13)
    model = dx.onnx.load(path)
    y = model({"x": dx.input("x", (2, 3, 4), "float32"),
               "i": dx.input("i", (2, 2, 1), "int64")})["y"]
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    good = np.array([[[2], [0]], [[-1], [1]]])
    np.testing.assert_array_equal(dx.run(y, inputs={"x": x, "i": good}, client=client),
                                  runtime(path, {"x": x, "i": good})["y"])
    with pytest.raises(dx.ExecutionError, match="index 3 is out of range for axis 1 of "
                                                "size 3"):
        dx.run(y, inputs={"x": x, "i": np.array([[[3], [0]], [[0], [0]]])}, client=client)
