"""ONNX's own backend node tests (the data shipped in the onnx 1.22.0 wheel), run through
`dx.onnx`: every test whose model uses only operators of `dx.onnx.SUPPORTED` is imported and
run, under the default plan and under a tiny memory budget that forces many chunks, and its
outputs are compared with ONNX's expected ones with ONNX's own tolerances (rtol 1e-3,
atol 1e-7; exact for integers and bools).

A test that converts to a `SpecError` (an attribute value, data type or feature deepx_flow
does not take: a negative slice step, say) is skipped with that reason: deepx_flow refused it
by name, which is not a wrong result. `docs/onnx.md` lists those, generated with the table of
supported operators by `python -m deepx_flow.onnx.conformance`, and a test here keeps it
current.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import PlanError, SpecError  # noqa: E402
from deepx_flow.ir import dtypes  # noqa: E402
from deepx_flow.onnx import conformance  # noqa: E402
from tests.helpers import cluster_with_memory  # noqa: E402

RTOL, ATOL = 1e-3, 1e-7  # onnx.backend.test.runner's defaults
TINY = cluster_with_memory(4 * 2**10)  # a budget of 2 KiB per task: many chunks
CASES = conformance.supported_cases()


def run_case(case, client, cluster=None):
    try:
        model, outs, feed, expected = conformance.build(case)
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
        if want.dtype.name == "bfloat16":  # NumPy kind V: compared as float64
            got, want = got.astype(np.float64), want.astype(np.float64)
        if dtypes.is_float(want.dtype):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True,
                                       err_msg=f"{case.name} output {name}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{case.name} output {name}")


def test_the_node_tests_are_there():
    """The onnx wheel of the test extra ships them; without them this module proves nothing."""
    assert conformance.backend_tests_dir() is not None, "install onnx==1.22.0 (the dev extra)"
    assert len(CASES) >= 800


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node(client, case):
    run_case(case, client)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node_in_many_chunks(client, case):
    run_case(case, client, cluster=TINY)


def test_docs_list_the_supported_operators_and_the_refusals_as_they_are():
    assert conformance.main(["--check"]) == 0, \
        "docs/onnx.md is stale: run python -m deepx_flow.onnx.conformance"
