"""Fused programs holding softmax and log_softmax (whole-axis instructions).

A fused softmax must give what the softmax task gives, to the bit: the same arithmetic
(`kernels.softmax`), however the blocked evaluator cuts the values into blocks, whatever the
operand's dtype, and with softmax and log_softmax of one value sharing their normalizer. The
results are also checked against NumPy in float64.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deepx_flow.ir.program import whole_axis_ref
from deepx_flow.kernels import fused_cpu, fused_numexpr, tasks
from tests.helpers import rows_of_infinities


def _softmax_program(op, axis, dtype, scale_dtype="float32", pair=False):
    """(x * 2) -> op along axis [-> times the other op along the axis, as an entropy is]."""
    x = ("in", 0)
    program = [("mul", (x, ("c", 2, scale_dtype)), dtype),
               (op, (("t", 0), whole_axis_ref(axis)), dtype)]
    if pair:
        other = "log_softmax" if op == "softmax" else "softmax"
        program += [(other, (("t", 0), whole_axis_ref(axis)), dtype),
                    ("mul", (("t", 1), ("t", 2)), dtype)]
    return tuple(program)


def _unfused(op, axis, x2, pair=False):
    """The same values from the softmax task (`tasks.softmax_chunk`) and NumPy."""
    first = tasks.softmax_chunk(op, axis, ((),), x2)
    if not pair:
        return first
    other = tasks.softmax_chunk("log_softmax" if op == "softmax" else "softmax", axis, ((),),
                                x2)
    return first * other


@settings(max_examples=80, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
       op=st.sampled_from(["softmax", "log_softmax"]), pair=st.booleans(),
       block=st.integers(1, 60), dtype=st.sampled_from(["float32", "float64"]),
       data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_a_fused_softmax_is_the_softmax_task_to_the_bit_in_any_blocks(
        shape, op, pair, block, dtype, data, seed):
    axis = data.draw(st.integers(0, len(shape) - 1))
    x = (np.random.default_rng(seed).standard_normal(shape) * 10).astype(dtype)
    program = _softmax_program(op, axis, dtype, dtype, pair)
    got = fused_cpu.evaluate_blocked(program, [x], shape, block_elements=block)
    want = _unfused(op, axis, x * np.asarray(2, dtype), pair)
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    np.testing.assert_array_equal(got, want)
    # And against NumPy in float64.
    x64 = x.astype(np.float64) * 2
    log_p = x64 - x64.max(axis=axis, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=axis, keepdims=True))
    ref = {"softmax": np.exp(log_p), "log_softmax": log_p}[op]
    ref = ref * (log_p if op == "softmax" else np.exp(log_p)) if pair else ref
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * (1 + np.abs(ref).max()))


def test_evaluate_takes_the_blocked_path_at_the_output_shape():
    # The operand is a (4, 1) column broadcast to (4, 5): normalized over the 5 output columns
    # (1/5 each), not over the column's single value (1.0).
    x = np.arange(4, dtype=np.float32).reshape(4, 1)
    program = _softmax_program("softmax", 1, "float32")
    got = fused_cpu.evaluate(program, [x], (4, 5))
    np.testing.assert_allclose(got, np.full((4, 5), 0.2, np.float32), rtol=1e-6)
    assert fused_cpu.engine_for(program, ["float32"]) == "blocked"
    assert fused_numexpr.numexpr_source(program, ("float32",)) is None


def test_an_integer_operand_is_normalized_in_the_softmax_dtype():
    x = np.arange(-6, 6, dtype=np.int16).reshape(3, 4)
    program = (("softmax", (("in", 0), whole_axis_ref(1)), "float32"),)
    got = fused_cpu.evaluate(program, [x], (3, 4))
    np.testing.assert_array_equal(got, tasks.softmax_chunk("softmax", 1, ((),), x))
    assert got.dtype == np.float32


def test_infinities_and_nan_give_what_the_softmax_task_gives():
    x = rows_of_infinities()
    for op in ("softmax", "log_softmax"):
        program = ((op, (("in", 0), whole_axis_ref(1)), "float32"),)
        with np.errstate(invalid="ignore"):
            want = tasks.softmax_chunk(op, 1, ((),), x)
        got = fused_cpu.evaluate_blocked(program, [x], x.shape, block_elements=5)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [0, 1])
def test_a_prologue_with_a_softmax_reduces_whatever_axis_it_normalizes(axis):
    # reduce_partial cuts its chunk into blocks of rows along axis 0, unless the prologue
    # normalizes along it: then the chunk is computed whole.
    x = np.random.default_rng(5).standard_normal((3000, 7)).astype(np.float32)
    prologue = _softmax_program("softmax", axis, "float32", pair=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tasks, "REDUCE_BLOCK_ELEMENTS", 64)
        got = tasks.reduce_partial("sum", prologue, (1 - axis,), "float64", x.shape, [()], x)
    entropy = _unfused("softmax", axis, x * np.float32(2), pair=True).astype(np.float64)
    np.testing.assert_allclose(got, entropy.sum(axis=1 - axis, keepdims=True), rtol=1e-12,
                               atol=1e-12 * np.abs(entropy).sum())
