"""ONNX's CumSum both ways: models built with `onnx.helper` give ONNX Runtime's outputs on
every combination of `exclusive` and `reverse`, negative axes and the types ONNX Runtime
takes, also split into many chunks along the scanned axis; `dx.cumsum` graphs of every
dtype are written as one CumSum each (with the casts NumPy's dtype rules need), give
ONNX Runtime's outputs, and load back to the same results; an attribute value CumSum does
not define is one SpecError naming the node."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import SpecError  # noqa: E402
from tests.helpers import assert_sums_close, cluster_with_memory  # noqa: E402

TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE,
         "int32": TensorProto.INT32, "int64": TensorProto.INT64}
SMALL = cluster_with_memory(8 * 2**10)  # tasks of a few KiB: lines cut into many chunks


def cumsum_model(path, shape, dtype, axis, exclusive, reverse, axis_type=np.int64):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], name="running",
                            exclusive=exclusive, reverse=reverse)
    graph = helper.make_graph(
        [node], "cumsum", [helper.make_tensor_value_info("x", TYPES[dtype], list(shape))],
        [helper.make_tensor_value_info("y", TYPES[dtype], list(shape))],
        [numpy_helper.from_array(np.array(axis, dtype=axis_type), "axis")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    return str(path)


def runtime(path, feed):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


@pytest.mark.parametrize("dtype", list(TYPES))
def test_cumsum_models_give_onnx_runtimes_outputs(client, tmp_path, dtype):
    rng = np.random.default_rng(0)
    shape = (6, 700)
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    for axis, exclusive, reverse in itertools.product((1, -2, -1), (0, 1), (0, 1)):
        path = cumsum_model(tmp_path / f"c{axis}{exclusive}{reverse}.onnx", shape, dtype,
                            axis, exclusive, reverse, np.int32 if axis == -2 else np.int64)
        model = dx.onnx.load(path)
        y = model(x=dx.input("x", shape, dtype))["y"]
        assert y.dtype == dtype  # ONNX keeps the input's type
        want = runtime(path, {"x": x})["y"]
        for cluster in (None, SMALL):
            got = dx.run(y, inputs={"x": x}, client=client, cluster=cluster)
            assert got.dtype == want.dtype
            if dtype.startswith("int"):
                np.testing.assert_array_equal(got, want)
            else:  # ONNX Runtime adds float32 in float32, deepx_flow in float64
                terms = runtime(path, {"x": np.abs(x)})["y"].astype(np.float64)
                assert_sums_close(got, want, terms, rtol=1e-6 if dtype == "float32" else 1e-13)
    plan = dx.compile(y, cluster=SMALL)
    assert len(plan.chunks[y.node.id][1]) > 1  # the scanned axis was split


def test_an_int32_cumsum_wraps_in_int32_as_onnx_runtime_does(client, tmp_path):
    path = cumsum_model(tmp_path / "wrap.onnx", (3, 4), "int32", 1, 0, 0)
    x = np.full((3, 4), 2**30, dtype=np.int32)
    got = dx.run(dx.onnx.load(path)(x=dx.input("x", (3, 4), "int32"))["y"], inputs={"x": x},
                 client=client)
    np.testing.assert_array_equal(got, runtime(path, {"x": x})["y"])


@pytest.mark.parametrize("value", [2, -1])
def test_an_undefined_attribute_value_is_one_error_naming_the_node(tmp_path, value):
    path = cumsum_model(tmp_path / "bad.onnx", (3, 4), "float32", 1, value, 0)
    with pytest.raises(SpecError, match=r"'running'.*exclusive must be 0 or 1, got "
                                        f"{value}"):
        dx.onnx.load(path)(x=dx.input("x", (3, 4), "float32"))


def scans():
    rng = np.random.default_rng(1)
    arrays = {"f": rng.standard_normal((5, 40)).astype(np.float32),
              "d": rng.standard_normal((5, 40)),
              "h": rng.standard_normal((5, 40)).astype(np.float16),
              "b": rng.standard_normal((5, 40)).astype(np.float32),
              "i8": rng.integers(-100, 100, (5, 40)).astype(np.int8),
              "u": rng.integers(0, 2**64 - 1, (5, 40), dtype=np.uint64),
              "m": rng.random((5, 40)) < 0.5}
    t = {k: dx.input(k, a.shape, a.dtype.name) for k, a in arrays.items()}
    outputs = {"f_rows": dx.cumsum(t["f"], axis=1),
               "f_back": dx.cumsum(t["f"], axis=-2, exclusive=True, reverse=True),
               "d_excl": dx.cumsum(t["d"], axis=1, exclusive=True),
               "h_rev": dx.cumsum(t["h"], axis=1, reverse=True),
               # bfloat16 inside (ONNX Runtime takes no bfloat16 arrays), computed in float64
               "b_rows": dx.cumsum(t["b"].astype("bfloat16"), axis=1).astype("float32"),
               "i8_rows": dx.cumsum(t["i8"], axis=1),
               "u_rows": dx.cumsum(t["u"], axis=0),
               "m_count": dx.cumsum(t["m"], axis=1, reverse=True)}
    return outputs, arrays


def test_cumsum_exports_as_cumsum_and_loads_back(client, tmp_path):
    outputs, arrays = scans()
    path = dx.onnx.save(outputs, tmp_path / "scans.onnx")
    proto = onnx.load(path)
    assert [n.op_type for n in proto.graph.node].count("CumSum") == len(outputs)
    got = runtime(path, arrays)
    ours = dict(zip(outputs, dx.run(list(outputs.values()), inputs=arrays, client=client)))
    for name in outputs:
        assert got[name].dtype == ours[name].dtype and got[name].shape == ours[name].shape
        if got[name].dtype.kind in "biu":
            np.testing.assert_array_equal(got[name], ours[name], err_msg=name)
        else:
            # ONNX Runtime adds float16 and float32 in float32, deepx_flow in float64
            eps = 2.0**-8 if name == "b_rows" else {"float16": 2e-3, "float32": 1e-6}.get(
                ours[name].dtype.name, 1e-13)
            terms = np.cumsum(np.abs(ours[name].astype(np.float64)), axis=1) + 1
            assert_sums_close(got[name].astype(np.float64), ours[name], terms, rtol=eps)
    model = dx.onnx.load(path)
    back = model({k: dx.input(k, a.shape, a.dtype.name) for k, a in arrays.items()})
    again = dx.run([back[n] for n in outputs], inputs=arrays, client=client)
    for name, value in zip(outputs, again):
        assert value.dtype == ours[name].dtype, name
        np.testing.assert_array_equal(value, ours[name], err_msg=name)
