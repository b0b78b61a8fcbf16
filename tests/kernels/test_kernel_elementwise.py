"""apply_op: every elementwise operator against an independent float64 (or exact) reference."""

import numpy as np
import pytest

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels.elementwise import OPS, apply_op, compute_dtype, constant
from tests.kernels.cases import ALL_CASES, assert_matches, case_id, operands, reference


def test_every_operator_of_the_op_table_has_a_kernel():
    from deepx_flow.ops.elementwise import specs
    # "fused" is the compiler's container of programs, not an operator inside them
    assert {s.name for s in specs()} - {"fused"} == set(OPS)


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_apply_op_matches_reference(case):
    op, ins, r = case
    # the second and third operands broadcast against the first
    shapes = [(3, 17), (17,), (3, 1)][:len(ins)]
    arrays = [operands(op, ins, s, seed=i)[i] for i, s in enumerate(shapes)]
    result = apply_op(op, arrays, r, np)
    assert_matches(result, reference(op, arrays, r), r, what=case_id(case))


@pytest.mark.parametrize("case", ALL_CASES[::7], ids=case_id)
def test_apply_op_into_out_buffer(case):
    op, ins, r = case
    arrays = operands(op, ins, (4, 5))
    out = np.full((4, 5), 7, dtype=r)
    got = apply_op(op, arrays, r, np, out=out)
    assert got is out
    assert_matches(out, reference(op, arrays, r), r, what=case_id(case))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_maximum_minimum_propagate_nan_and_handle_infinities(dtype):
    a = np.array([np.nan, 1, np.nan, -np.inf, np.inf, 0.0, 2], dtype=dtype)
    b = np.array([1, np.nan, np.nan, 2, -np.inf, -0.0, 2], dtype=dtype)
    np.testing.assert_array_equal(apply_op("maximum", [a, b], dtype, np),
                                  [np.nan, np.nan, np.nan, 2, np.inf, 0, 2])
    np.testing.assert_array_equal(apply_op("minimum", [a, b], dtype, np),
                                  [np.nan, np.nan, np.nan, -np.inf, -np.inf, 0, 2])
    relu = apply_op("relu", [a], dtype, np)
    np.testing.assert_array_equal(relu, [np.nan, 1, np.nan, 0, np.inf, 0, 2])


def test_div_is_true_division_with_numpy_zero_rules():
    a = np.array([1, -1, 0, 7], dtype=np.int32)
    b = np.array([0, 0, 0, 2], dtype=np.int32)
    got = apply_op("div", [a, b], "float64", np)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [np.inf, -np.inf, np.nan, 3.5])


def test_typed_constants_keep_float32():
    x = np.array([1.0, 2.0], dtype=np.float32)
    c = constant(16777217.0, "float32")  # rounds to 2**24 in float32
    assert c.dtype == np.float32 and c.shape == ()
    s = apply_op("add", [x, c], "float32", np)
    assert s.dtype == np.float32
    # (1 + 2**24) - 2**24 is 0 in float32, 1 in float64
    np.testing.assert_array_equal(apply_op("sub", [s, c], "float32", np), [0.0, 2.0])


def test_float16_composites_compute_in_float32_and_round_once():
    assert compute_dtype("float16") == "float32" and compute_dtype("int8") == "int8"
    x = np.linspace(-6, 6, 101).astype(np.float16)
    for op in ("sigmoid", "gelu"):
        got = apply_op(op, [x], "float16", np)
        want = apply_op(op, [x.astype(np.float32)], "float32", np).astype(np.float16)
        np.testing.assert_array_equal(got, want)


def test_cast_copies_and_converts_like_astype():
    x = np.array([1.7, -2.5, 300.0, np.nan], dtype=np.float64)
    got = apply_op("cast", [x], "float16", np)
    np.testing.assert_array_equal(got, x.astype(np.float16))
    same = apply_op("cast", [x], "float64", np)
    assert same is not x and not np.shares_memory(same, x)


def test_unknown_operator_is_an_execution_error():
    with pytest.raises(ExecutionError, match="unknown elementwise operator 'frobnicate'"):
        apply_op("frobnicate", [np.zeros(2)], "float64", np)
