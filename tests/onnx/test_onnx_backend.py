"""ONNX's own backend node tests (the data shipped in the onnx 1.22.0 wheel), run through
`dx.onnx`: every test whose model uses only operators of `dx.onnx.SUPPORTED` is imported and
run, under the default plan and under a tiny memory budget that forces many chunks, and its
outputs are compared with ONNX's expected ones with ONNX's own tolerances (rtol 1e-3,
atol 1e-7; exact for integers and bools).

A test that converts to a `SpecError` (an attribute value, data type or feature deepx_flow
does not take: a negative slice step, say) is skipped with that reason: deepx_flow refused it
by name, which is not a wrong result. `docs/onnx.md` lists them, generated with the supported
operators by `python -m deepx_flow.onnx.report`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import PlanError, SpecError  # noqa: E402
from deepx_flow.onnx.model import identifier  # noqa: E402
from deepx_flow.onnx.ops import SUPPORTED  # noqa: E402
from tests.helpers import cluster_with_memory  # noqa: E402

RTOL, ATOL = 1e-3, 1e-7  # onnx.backend.test.runner's defaults
TINY = cluster_with_memory(4 * 2**10)  # a budget of 2 KiB per task: many chunks


def node_tests_dir() -> Path | None:
    spec = importlib.util.find_spec("onnx")
    root = Path(list(spec.submodule_search_locations)[0]) / "backend" / "test" / "data" / "node"
    return root if root.is_dir() else None


def supported_cases() -> list[Path]:
    """The node tests whose models use only operators deepx_flow converts."""
    root = node_tests_dir()
    if root is None:
        return []
    cases = []
    for case in sorted(root.iterdir()):
        model = case / "model.onnx"
        if not model.is_file():
            continue
        proto = onnx.load(str(model), load_external_data=False)
        if proto.graph.node and all(n.op_type in SUPPORTED and n.domain in ("", "ai.onnx")
                                    for n in proto.graph.node):
            cases.append(case)
    return cases


CASES = supported_cases()


def read_case(case: Path):
    data = case / "test_data_set_0"
    arrays = {}
    for kind in ("input", "output"):
        found = []
        for file in sorted(data.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1])):
            tensor = onnx.TensorProto()
            tensor.ParseFromString(file.read_bytes())
            found.append((tensor.name, onnx.numpy_helper.to_array(tensor)))
        arrays[kind] = found
    return arrays["input"], arrays["output"]


def shape_like(array: np.ndarray) -> bool:
    """An input that holds shapes, axes, bounds or indices (which ONNX's tests pass as
    inputs): a small integer vector or scalar."""
    return array.dtype.kind in "iu" and array.ndim <= 1 and array.size <= 16


def build(case: Path, constants: bool):
    """The model of `case` on its test inputs: tensors, and (with `constants`) its
    shape-like inputs as NumPy arrays, which a static graph needs known while building."""
    model = dx.onnx.load(case / "model.onnx")
    inputs, expected = read_case(case)
    feed, given = {}, {}
    for name, (_, array) in zip(model.input_names, inputs):
        if constants and shape_like(array):
            given[name] = array
            continue
        key = identifier(name)
        feed[key] = array
        given[name] = dx.input(key, array.shape, array.dtype.name)
    return model, model(given), feed, expected


def run_case(case: Path, client, cluster=None):
    try:
        try:
            model, outs, feed, expected = build(case, constants=False)
        except SpecError as err:
            if "must be a constant" not in str(err):
                raise
            model, outs, feed, expected = build(case, constants=True)
    except SpecError as err:
        pytest.skip(f"refused: {err}")
    wanted = [outs[n] for n in model.output_names]
    read = {n.id for n in dx.build_graph(wanted).nodes if n.op == "input"}
    feed = {k: v for k, v in feed.items() if k in read}  # CastLike reads only a type
    try:
        results = dx.run(wanted, inputs={**model.inputs_for(wanted), **feed}, client=client,
                         cluster=cluster)
    except PlanError as err:
        if cluster is None:
            raise
        pytest.skip(f"does not fit the tiny budget (a correct refusal): {err}")
    assert len(results) == len(expected)
    for got, (name, want) in zip(results, expected):
        got = np.asarray(got)
        assert got.dtype == want.dtype, f"{case.name} output {name}: {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{case.name} output {name}: {got.shape} != {want.shape}"
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True,
                                       err_msg=f"{case.name} output {name}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{case.name} output {name}")


def test_the_node_tests_are_there():
    """The onnx wheel of the test extra ships them; without them this module proves nothing."""
    assert node_tests_dir() is not None, "install onnx==1.22.0 (the dev extra)"
    assert len(CASES) >= 300


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node(client, case):
    run_case(case, client)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node_in_many_chunks(client, case):
    run_case(case, client, cluster=TINY)
