"""Programs of exact operations compiled with numba (`kernels/fused_numba.py`) give the
reference evaluator's results to the bit (`fused_cpu`, NumPy's ufuncs instruction by
instruction), infinities, negative zeros and subnormals included (NaN stays NaN: its sign
bits are not NumPy's promise), broadcasting as NumPy does, also written over an operand;
other programs are not taken."""

import numpy as np
from hypothesis import given, settings, strategies as st

from deepx_flow.kernels import fused_cpu, fused_numba

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, np.nan, np.inf, -np.inf, 1e-45, 5e-324, -3e38, 3e38,
           6.0, -3.0]


def assert_same_bits(got, want):
    """Equal bit for bit where not NaN (signs of zeros included), NaN where NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bits = np.dtype(f"u{want.dtype.itemsize}")
    np.testing.assert_array_equal(got.view(bits)[~nan], want.view(bits)[~nan])
# with (2, 3, 4, 5): operands of the row form (each spans all trailing axes or none) and of
# the ufunc's (an operand varying along some trailing axes only: (1, 3, 1, 5))
SHAPES = [(3, 4, 5), (1, 4, 1), (3, 1, 5), (4, 1), (5,), (), (2, 3, 4, 5), (1, 3, 1, 5),
          (2, 1, 1, 1), (2, 3, 1, 1), (1, 1, 4, 5)]


@st.composite
def programs(draw, dtype):
    n_inputs = draw(st.integers(1, 3))
    program = []
    for j in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(sorted(fused_numba.EXACT_OPS)))
        arity = 1 if op in ("neg", "abs", "relu") else 2
        args = []
        for _ in range(arity):
            kind = draw(st.sampled_from(["in", "t", "c"] if j else ["in", "c"]))
            if kind == "in":
                args.append(("in", draw(st.integers(0, n_inputs - 1))))
            elif kind == "t":
                args.append(("t", draw(st.integers(0, j - 1))))
            else:
                # as programs hold them: Python floats, rounded to the dtype when evaluated
                args.append(("c", draw(st.sampled_from([0.0, -0.0, 1.0, -2.5, 1 / 6, 0.1, 0.5,
                                                        1 / 3, 3e38, 5e-324])), dtype))
        program.append((op, tuple(args), dtype))
    return tuple(program), n_inputs


@settings(max_examples=80, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "float64"]))
def test_compiled_programs_give_the_reference_bits(data, dtype):
    program, n_inputs = data.draw(programs(dtype))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    shapes = [data.draw(st.sampled_from(SHAPES)) for _ in range(n_inputs)]
    arrays = []
    for shape in shapes:
        a = rng.standard_normal(shape) * 4
        mask = rng.random(shape) < 0.3
        a = np.asarray(np.where(mask, rng.choice(SPECIAL, shape), a), dtype)
        if a.ndim >= 2 and data.draw(st.booleans()):  # a strided view: the ufunc's form
            a = np.swapaxes(np.ascontiguousarray(np.swapaxes(a, 0, 1)), 0, 1)
        arrays.append(a)
    assert fused_numba.compilable(program, [a.dtype.name for a in arrays])
    shape = np.broadcast_shapes(*shapes)
    want = fused_cpu.evaluate(program, arrays, shape)
    got = fused_numba.evaluate(program, arrays, np.empty(shape, dtype))
    assert_same_bits(got, want)
    if arrays[0].shape == shape:  # written over its first operand, as a chain does
        got = fused_numba.evaluate(program, arrays, arrays[0])
        assert_same_bits(got, want)


def test_the_row_form_is_taken_where_operands_span_all_trailing_axes_or_none():
    out = np.empty((16, 2, 7, 7), np.float32)
    x, bias, gate = out.copy(), np.ones((16, 1, 1, 1), np.float32), np.ones((16, 2, 1, 1),
                                                                          np.float32)
    views, patterns, result = fused_numba._as_rows([x, bias, gate], out)
    assert patterns == ((True, True, True), (True, False, False), (True, True, False))
    assert result.shape == (16, 2, 49) and all(np.shares_memory(v, a) for v, a in
                                               zip(views, [x, bias, gate]))
    assert fused_numba._as_rows([np.ones((1, 1, 7, 1), np.float32)], out) is None
    assert fused_numba._as_rows([x.transpose(1, 0, 2, 3).copy().transpose(1, 0, 2, 3)],
                                out) is None


def test_a_result_overlapping_an_operand_is_what_fresh_memory_would_get():
    program = (("add", (("in", 0), ("in", 1)), "float64"),
               ("mul", (("t", 0), ("c", 3.0, "float64")), "float64"))
    for shift in (0, 1, -1):
        store = np.arange(40.0)
        x, y = store[5:25].reshape(4, 5), np.linspace(-1, 1, 20).reshape(4, 5)
        out = store[5 + shift:25 + shift].reshape(4, 5)
        want = fused_cpu.evaluate(program, [x.copy(), y], x.shape)
        got = fused_numba.evaluate(program, [x, y], out)
        assert_same_bits(got, want)


def test_a_prepared_program_given_other_shapes_of_the_same_size_is_still_right():
    program = (("mul", (("in", 0), ("in", 1)), "float64"),)
    rng = np.random.default_rng(4)
    x, bias = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 1, 1))
    run = fused_numba.prepare(program, [x, bias], np.empty_like(x))
    y, other = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 1, 1))  # same sizes
    assert_same_bits(run([y, other], np.empty_like(y)),
                     fused_cpu.evaluate(program, [y, other], y.shape))


def test_negative_zeros_and_nans_follow_numpy():
    x = np.array([-0.0, 0.0, np.nan, -1.0, 2.0, -np.inf], np.float32)
    for program in ((("relu", (("in", 0),), "float32"),),
                    (("neg", (("in", 0),), "float32"),),
                    (("abs", (("in", 0),), "float32"),),
                    (("maximum", (("in", 0), ("c", 1.0, "float32")), "float32"),),
                    (("minimum", (("c", 1.0, "float32"), ("in", 0)), "float32"),)):
        got = fused_numba.evaluate(program, [x], np.empty_like(x))
        assert_same_bits(got, fused_cpu.evaluate(program, [x], x.shape))
    for a, b in ((x, -x[::-1]), (-x, x)):  # maximum and minimum between 0.0 and -0.0
        for op in ("maximum", "minimum"):
            program = ((op, (("in", 0), ("in", 1)), "float32"),)
            assert_same_bits(fused_numba.evaluate(program, [a, b], np.empty_like(a)),
                             fused_cpu.evaluate(program, [a, b], a.shape))


def test_programs_differing_in_the_sign_of_a_zero_constant_are_two_programs():
    x = np.array([-0.0, 1.0, -2.0], np.float32)
    for zero in (0.0, -0.0, 0.0):
        program = (("mul", (("in", 0), ("c", zero, "float32")), "float32"),)
        assert_same_bits(fused_numba.evaluate(program, [x], np.empty_like(x)),
                         fused_cpu.evaluate(program, [x], x.shape))


def test_other_programs_are_not_taken():
    f32 = "float32"
    assert not fused_numba.compilable((("exp", (("in", 0),), f32),), [f32])  # not exact
    assert not fused_numba.compilable((("div", (("in", 0), ("in", 1)), f32),), [f32, f32])
    assert not fused_numba.compilable((("add", (("in", 0), ("in", 1)), "float64"),),
                                      [f32, "float64"])  # a float32 input widened
    assert not fused_numba.compilable((("add", (("in", 0), ("in", 1)), "float16"),),
                                      ["float16", "float16"])
    for constant in (np.inf, 1e39, 10**400):  # not finite, once a float32
        assert not fused_numba.compilable((("add", (("in", 0), ("c", constant, f32)), f32),),
                                          [f32])
    assert fused_numba.compilable((("add", (("in", 0), ("c", 0.5, f32)), f32),), [f32])
