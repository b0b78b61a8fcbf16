"""Sums of exact programs over leading rows compiled to one loop (`kernels/reduce_numba.py`)
give the NumPy path's result to the bit (`tasks._reduce_by_rows`: the same blocks, the same
order of additions), infinities, negative zeros and divisions by zero included; they are close
to NumPy's float64 sum; programs and layouts the loop does not take go to NumPy."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from deepx_flow.kernels import compiled, reduce_numba, tasks
from tests.kernels.test_fused_numba import SPECIAL, assert_same_bits

OPS = sorted(reduce_numba.EXACT_OPS)


def numpy_path(*args):
    """`tasks.reduce_partial` as a process without compiled kernels runs it."""
    with mock.patch.object(compiled, "allowed", lambda: False):
        assert reduce_numba.column_sums((), [np.ones((4, 2))], {}, (4, 2), (0,), None, 2) \
            is None
        return tasks.reduce_partial(*args)


def compiled_path(*args):
    """`tasks.reduce_partial`, asserting that the compiled loop took it."""
    with mock.patch.object(reduce_numba, "_compile", wraps=reduce_numba._compile) as made:
        reduce_numba._kernels.clear()
        got = tasks.reduce_partial(*args)
    assert made.called, "the compiled loop did not take this sum"
    return got


@st.composite
def programs(draw, dtype, n_inputs):
    program = []
    for j in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(OPS))
        arity = 1 if op in ("neg", "abs", "relu") else 2
        args = []
        for _ in range(arity):
            kind = draw(st.sampled_from(["in", "t", "c"] if j else ["in", "c"]))
            if kind == "in":
                args.append(("in", draw(st.integers(0, n_inputs - 1))))
            elif kind == "t":
                args.append(("t", draw(st.integers(0, j - 1))))
            else:
                args.append(("c", draw(st.sampled_from([0.0, -0.0, 1.0, -2.5, 0.1, 3e38])),
                             dtype))
        program.append((op, tuple(args), dtype))
    # every input read, so that the space's shape is the operands' broadcast
    program.append(("add", (("t", len(program) - 1), ("in", 0)), dtype))
    return tuple(program)


def operand(rng, shape, dtype, special):
    a = np.array(rng.standard_normal(shape) * 4)
    if special:
        mask = rng.random(shape) < 0.2
        a[mask] = rng.choice(SPECIAL, size=int(mask.sum()))
    return np.ascontiguousarray(a.astype(dtype))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "float64"]),
       rows=st.sampled_from([70_000, 131_072, 300_001]), cols=st.sampled_from([2, 3, 256]),
       acc=st.sampled_from(["float64", None]), special=st.booleans())
def test_compiled_sums_give_the_numpy_paths_bits(data, dtype, rows, cols, acc, special):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n_inputs = data.draw(st.integers(1, 3))
    program = data.draw(programs(dtype, n_inputs))
    space = (rows, cols)
    # the first input spans the space; the others are per-column, per-row or one value
    shapes = [space] + [data.draw(st.sampled_from([(1, cols), (cols,), (rows, 1), (), space]))
                        for _ in range(n_inputs - 1)]
    arrays = [operand(rng, s, dtype, special) for s in shapes]
    args = ("sum", program, (0,), acc, space, ((),) * n_inputs, *arrays)
    want = numpy_path(*args)
    got = compiled_path(*args)
    assert_same_bits(got, want)


@pytest.mark.parametrize("shape,axes", [((70_000, 3), (0,)), ((1, 200_000, 2), (0, 1)),
                                        ((256, 64, 32), (0,)), ((1, 90_000, 1), (0, 1))])
def test_a_plain_float32_sum_in_float64_is_numpys_bits_and_close_to_float64(shape, axes):
    x = operand(np.random.default_rng(1), shape, "float32", special=False)
    args = ("sum", None, axes, "float64", shape, ((),), x)
    got = compiled_path(*args) if shape[-1] > 1 else tasks.reduce_partial(*args)
    assert_same_bits(got, numpy_path(*args))
    want = x.astype(np.float64).sum(axis=axes, keepdims=True)
    scale = np.abs(x).astype(np.float64).sum(axis=axes, keepdims=True)
    np.testing.assert_array_less(np.abs(got - want), 1e-13 * scale + 1e-300)


def test_a_standardization_pass_takes_its_hoisted_square_root_as_an_operand():
    """((x - m) / sqrt(v))**3 summed: sqrt is not exact, but every row shares it."""
    rng = np.random.default_rng(2)
    x = operand(rng, (100_000, 16), "float32", special=False)
    m = x.mean(axis=0, keepdims=True)
    v = x.var(axis=0, keepdims=True)
    program = (("sub", (("in", 0), ("in", 1)), "float32"),
               ("sqrt", (("in", 2),), "float32"),
               ("div", (("t", 0), ("t", 1)), "float32"),
               ("mul", (("t", 2), ("t", 2)), "float32"),
               ("mul", (("t", 3), ("t", 2)), "float32"))
    args = ("mean", program, (0,), "float64", x.shape, ((),) * 3, x, m, v)
    got = compiled_path(*args)
    assert_same_bits(got, numpy_path(*args))
    z = (x.astype(np.float64) - m) / np.sqrt(v.astype(np.float64))
    want = (z ** 3).sum(axis=0, keepdims=True)
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(z ** 3).sum(axis=0).max())


def test_a_value_every_row_shares_is_added_once_per_row():
    """No operand spans the rows: the sum is still over all of them."""
    c = np.arange(1, 5, dtype=np.float32).reshape(1, 4)
    program = (("mul", (("in", 0), ("c", 2.0, "float32")), "float32"),)
    args = ("sum", program, (0,), "float64", (100_000, 4), ((),), c)
    got = compiled_path(*args)
    np.testing.assert_array_equal(got, 2.0 * 100_000 * c)
    assert_same_bits(got, numpy_path(*args))


def test_a_division_by_zero_gives_numpys_infinities_not_an_exception():
    x = np.zeros((80_000, 2), np.float32)
    x[::3, 0] = 1.0
    x[::5, 1] = -1.0
    program = (("div", (("in", 0), ("c", 0.0, "float32")), "float32"),)
    args = ("sum", program, (0,), "float64", x.shape, ((),), x)
    got = compiled_path(*args)
    assert_same_bits(got, numpy_path(*args))
    assert np.isnan(got[0, 0]) and np.isnan(got[0, 1])  # inf + nan (0/0) along each


def test_other_programs_and_layouts_go_to_numpy():
    x = np.ones((80_000, 4), np.float32)
    exp = (("exp", (("in", 0),), "float32"),)
    assert reduce_numba.column_sums(exp, [x], {}, x.shape, (0,), "float64", 16) is None
    # a sum over the trailing axis, a transposed operand, a mixed dtype, one column
    ident = (("add", (("in", 0), ("c", 0.0, "float32")), "float32"),)
    assert reduce_numba.column_sums(ident, [x[:, :1].copy()], {}, (80_000, 1), (0,),
                                    "float64", 16) is None
    assert reduce_numba.column_sums(ident, [x], {}, x.shape, (1,), "float64", 16) is None
    assert reduce_numba.column_sums(ident, [x.T.copy().T], {}, x.shape, (0,), "float64",
                                    16) is None
    assert reduce_numba.column_sums(ident, [x.astype(np.float64)], {}, x.shape, (0,),
                                    "float64", 16) is None
    big_endian = x.astype(">f4")  # numba types native byte order only
    assert reduce_numba.column_sums(ident, [big_endian], {}, x.shape, (0,), "float64",
                                    16) is None
    np.testing.assert_array_equal(
        tasks.reduce_partial("sum", ident, (0,), "float64", x.shape, ((),), big_endian),
        np.full((1, 4), 80_000.0))
    # and what NumPy then gives is right
    got = tasks.reduce_partial("sum", exp, (0,), "float64", x.shape, ((),), x)
    np.testing.assert_allclose(got, np.full((1, 4), 80_000 * np.e), rtol=1e-6)
