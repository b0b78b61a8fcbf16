"""Programs of exact operations compiled with numba (`kernels/fused_numba.py`) give the
reference evaluator's results to the bit (`fused_cpu`, NumPy's ufuncs instruction by
instruction), NaN, infinities, negative zeros and subnormals included, broadcasting as
NumPy does; other programs are not taken."""

import numpy as np
from hypothesis import given, settings, strategies as st

from deepx_flow.kernels import fused_cpu, fused_numba

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, np.nan, np.inf, -np.inf, 1e-45, -3e38, 3e38, 6.0, -3.0]
SHAPES = [(3, 4, 5), (1, 4, 1), (3, 1, 5), (4, 1), (5,), ()]


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
                args.append(("c", float(np.dtype(dtype).type(
                    draw(st.sampled_from([0.0, 1.0, -2.5, 1 / 6, 0.5, 3e38])))), dtype))
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
        a = np.where(mask, rng.choice(SPECIAL, shape), a)
        arrays.append(np.asarray(a, dtype))
    assert fused_numba.compilable(program, [a.dtype.name for a in arrays])
    shape = np.broadcast_shapes(*shapes)
    want = fused_cpu.evaluate(program, arrays, shape)
    got = fused_numba.evaluate(program, arrays, np.empty(shape, dtype))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # NaN equals NaN here; 0.0 equals -0.0


def test_negative_zeros_and_nans_follow_numpy():
    x = np.array([-0.0, 0.0, np.nan, -1.0, 2.0, -np.inf], np.float32)
    for program in ((("relu", (("in", 0),), "float32"),),
                    (("neg", (("in", 0),), "float32"),),
                    (("abs", (("in", 0),), "float32"),),
                    (("maximum", (("in", 0), ("c", 1.0, "float32")), "float32"),),
                    (("minimum", (("c", 1.0, "float32"), ("in", 0)), "float32"),)):
        got = fused_numba.evaluate(program, [x], np.empty_like(x))
        want = fused_cpu.evaluate(program, [x], x.shape)
        np.testing.assert_array_equal(got, want)
        if program[0][0] in ("neg", "abs"):
            assert np.array_equal(np.signbit(got), np.signbit(want))


def test_other_programs_are_not_taken():
    f32 = "float32"
    assert not fused_numba.compilable((("exp", (("in", 0),), f32),), [f32])  # not exact
    assert not fused_numba.compilable((("div", (("in", 0), ("in", 1)), f32),), [f32, f32])
    assert not fused_numba.compilable((("add", (("in", 0), ("in", 1)), "float64"),),
                                      [f32, "float64"])  # a float32 input widened
    assert not fused_numba.compilable((("add", (("in", 0), ("in", 1)), "float16"),),
                                      ["float16", "float16"])
    assert not fused_numba.compilable((("add", (("in", 0), ("c", np.inf, f32)), f32),),
                                      [f32])
    assert fused_numba.compilable((("add", (("in", 0), ("c", 0.5, f32)), f32),), [f32])
