"""`x[::-1]` and `dx.flip` (issue 31, item 3): a slice stepping backwards is the same
elements taken with a positive step, then a `flip` node, which reads the mirrored region of
its operand on any chunk grid. Values against NumPy under grids of one to many chunks,
gradients against finite differences, the YAML form, and ONNX both ways."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import deepx_flow as dx
from deepx_flow.errors import GraphError
from tests.compiler.test_differentiate import check_gradients
from tests.helpers import cluster_with_memory

SHAPE = (7, 9, 5)
DATA = np.random.default_rng(0).standard_normal(SHAPE)
GRIDS = [cluster_with_memory(m) for m in (2**30, 4 * 2**10, 1024)]
BOUND = st.none() | st.integers(-10, 10)
STEP = st.none() | st.integers(-4, 4).filter(lambda s: s != 0)
ITEM = st.builds(slice, BOUND, BOUND, STEP) | st.integers(-5, 4)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(ITEM, ITEM, ITEM), min_size=1, max_size=4))
def test_any_slices_give_numpys_values_on_every_grid(client, indices):
    x = dx.input("x", SHAPE, "float64")
    outs = [x[i] for i in indices]
    for grid in GRIDS:
        got = dx.run(outs, inputs={"x": DATA}, client=client, cluster=grid, progress=False)
        for index, out in zip(indices, got):
            assert out.shape == DATA[index].shape, index
            np.testing.assert_array_equal(out, DATA[index], err_msg=str(index))


def test_flip_is_numpys_for_every_axis_argument(client):
    x = dx.input("x", SHAPE, "float64")
    axes = [None, 0, -1, (0, 2), [2, 1], ()]
    outs = [dx.flip(x, a) for a in axes] + [np.flip(x, 1)]
    got = dx.run(outs, inputs={"x": DATA}, client=client, cluster=GRIDS[2], progress=False)
    for a, out in zip(axes + [1], got):
        np.testing.assert_array_equal(out, np.flip(DATA, a))
    with pytest.raises(GraphError, match="repeated axis"):
        dx.flip(x, (0, -3))
    with pytest.raises(GraphError, match="axis 3 is out of range"):
        dx.flip(x, 3)


def test_gradients_of_backward_slices_and_flips(client):
    check_gradients(client, lambda x: x[5:0:-2, ::-1] * x[1:6:2, :], {"x": ((7, 6), -1, 1)})
    check_gradients(client, lambda x: dx.flip(x, (0, 1)) * x, {"x": ((5, 4), -1, 1)})


def test_the_yaml_form_reads_back_and_takes_numpys_axis_forms(client):
    x = dx.input("x", SHAPE, "float64")
    graph = dx.from_yaml(dx.to_yaml(x[::-2, 3, 4:0:-1]))
    (got,) = dx.run(graph, inputs={"x": DATA}, client=client, progress=False).values()
    np.testing.assert_array_equal(got, DATA[::-2, 3, 4:0:-1])
    for axes, want in (("null", None), ("-1", -1), ("[2, 0]", (0, 2))):
        spec = (f"deepx: 1\ninputs:\n  x: {{shape: {list(SHAPE)}, dtype: float64}}\n"
                f"nodes:\n- {{id: r, op: flip, args: [x], attrs: {{axes: {axes}}}}}\n"
                "outputs: [r]\n")
        (got,) = dx.run(dx.from_yaml(spec), inputs={"x": DATA}, client=client,
                        progress=False).values()
        np.testing.assert_array_equal(got, np.flip(DATA, want))


def test_a_flip_written_to_onnx_runs_in_onnx_runtime_on_a_dynamic_axis(client, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    x = dx.input("x", (3, 9, 5), "float32")
    out = (x[:, ::-3] * 2.0)[::-1]
    path = dx.onnx.save({"y": out}, tmp_path / "flip.onnx", dynamic_axes={"x": {0: "N"}})
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for rows in (3, 7):
        data = DATA[:rows].astype(np.float32)
        (got,) = session.run(None, {"x": data})
        np.testing.assert_array_equal(got, (data[:, ::-3] * 2.0)[::-1])
