"""bfloat16 in the CPU kernels: rounding once, exactly; every elementwise operator computed in
float32 and rounded once (what NumPy with ml_dtypes gives op by op); fused programs, on both
the blocked and the (refused) numexpr path, rounding after every bfloat16 instruction.

The rounding reference (`exact_bfloat16`) is exact rational arithmetic, independent of
ml_dtypes and of `kernels.bfloat16`.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import special

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels import bfloat16, fused_cpu, fused_numexpr
from deepx_flow.kernels.elementwise import GELU_C, GELU_K, apply_op, constant

BF16 = np.dtype(ml_dtypes.bfloat16)
MAX = Fraction(float(ml_dtypes.finfo(BF16).max))
# Past the largest finite bfloat16 by half a step (2**127 * 2**-8): rounds to infinity.
OVERFLOW = MAX + Fraction(2) ** 119


def exact_bfloat16(value) -> float:
    """The bfloat16 nearest to `value` (a float or an int), ties to even, as a float."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return value
    q = Fraction(value)
    if q == 0:
        return math.copysign(0.0, value) if isinstance(value, float) else 0.0
    sign, q = (-1 if q < 0 else 1), abs(q)
    if q >= OVERFLOW:
        return sign * math.inf
    e = -126  # the exponent of q's binade (subnormals share the smallest)
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    step = Fraction(2) ** (e - 7)  # 8 significant bits
    n, rest = divmod(q, step)
    if rest > step / 2 or (rest == step / 2 and n % 2 == 1):
        n += 1
    return sign * float(n * step)


def bits(x) -> np.ndarray:
    return np.asarray(x).view(np.uint16)


def same(got, want) -> bool:
    """Equal as bfloat16 bits, any NaN matching any NaN."""
    got, want = np.asarray(got, BF16), np.asarray(want, BF16)
    nan = np.isnan(got.astype(np.float32))
    return bool(np.array_equal(nan, np.isnan(want.astype(np.float32))) and
                np.array_equal(bits(got)[~nan], bits(want)[~nan]))


# -- rounding --------------------------------------------------------------------------------
TIES = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-30, 1 + 2**-8 - 2**-40, -(1 + 2**-8 + 2**-52),
        3.3961e38, 3.3963e38, 1e300, -1e300, 1e-300, -1e-300, 2**-133, 2**-134, 2**-134 * 1.5,
        0.0, -0.0]


@pytest.mark.parametrize("value", TIES)
def test_float64_rounds_once_where_ml_dtypes_rounds_twice(value):
    assert float(bfloat16.to_bfloat16(np.float64(value))) == exact_bfloat16(value) or \
        value == 0


def test_the_double_rounding_this_module_avoids_is_real():
    """ml_dtypes goes through float32: 1 + 2**-8 + 2**-30 lands on the tie and rounds to 1."""
    value = 1 + 2**-8 + 2**-30
    assert float(np.float64(value).astype(BF16)) == 1.0
    assert float(bfloat16.to_bfloat16(np.float64(value))) == 1 + 2**-7 == exact_bfloat16(value)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1,
                max_size=40))
def test_float64_to_bfloat16_is_correctly_rounded(values):
    got = bfloat16.to_bfloat16(np.array(values, np.float64)).astype(np.float64)
    want = [exact_bfloat16(v) for v in values]
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=40),
       st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40))
def test_64_bit_integers_round_once(signed, unsigned):
    got = bfloat16.to_bfloat16(np.array(signed, np.int64)).astype(np.float64)
    np.testing.assert_array_equal(got, [exact_bfloat16(v) for v in signed])
    got = bfloat16.to_bfloat16(np.array(unsigned, np.uint64)).astype(np.float64)
    np.testing.assert_array_equal(got, [exact_bfloat16(v) for v in unsigned])
    # just past a tie at 2**62: float64 alone would round the low bit away, then to even
    tie = (2**8 + 1) << 54
    assert float(bfloat16.to_bfloat16(np.array([tie + 1], np.int64))[0]) == \
        exact_bfloat16(tie + 1) == float((2**8 + 2) << 54)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int16", "uint8", "float16"])
def test_every_bfloat16_survives_a_round_trip(dtype):
    """All 65,536 bit patterns: widening is exact, and rounding back gives the same value
    (NaNs stay NaN; integers hold the integral values they can)."""
    every = np.arange(2**16, dtype=np.uint16).view(BF16)
    wide = every.astype(np.float32)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            keep = np.isfinite(wide) & (wide == np.round(wide)) & \
                (wide.astype(np.float64) >= info.min) & (wide.astype(np.float64) <= info.max)
        every, wide = every[keep], wide[keep]
    elif dtype == "float16":
        with np.errstate(over="ignore"):
            keep = ~np.isfinite(wide) | ((np.abs(wide) <= 65504) &
                                         (wide.astype(np.float16) == wide))
        every, wide = every[keep], wide[keep]
    with np.errstate(invalid="ignore"):
        there = bfloat16.astype(wide.astype(dtype), dtype)
    back = bfloat16.astype(there, "bfloat16")
    assert back.dtype == BF16
    if dtype.startswith(("int", "uint")):  # -0.0 comes back as 0
        np.testing.assert_array_equal(back.astype(np.float32), wide)
    else:
        assert same(back, every)


def test_nan_and_infinities_stay():
    got = bfloat16.to_bfloat16(np.array([np.nan, np.inf, -np.inf, -0.0]))
    assert np.isnan(float(got[0])) and list(got[1:3].astype(float)) == [np.inf, -np.inf]
    assert np.signbit(got[3].astype(np.float32))


# -- elementwise operators -------------------------------------------------------------------
def f32(x):
    return np.asarray(x).astype(np.float32)


# Each operator computed in float32 by NumPy from the widened operands: what a bfloat16
# result is rounded from (written out here, independently of kernels.elementwise).
IN_FLOAT32 = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "tanh": np.tanh, "sin": np.sin, "cos": np.cos, "tan": np.tan, "floor": np.floor,
    "ceil": np.ceil, "sign": np.sign, "round": np.rint, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "relu": lambda x: np.maximum(x, np.float32(0)),
    "sigmoid": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    "reciprocal": lambda x: np.float32(1) / x,
    "softplus": lambda x: np.logaddexp(np.float32(0), x),
    "erf": lambda x: special.erf(x).astype(np.float32),
    "gelu": lambda x: ((np.tanh((x + np.float32(GELU_C) * (x * x * x)) * np.float32(GELU_K))
                        + np.float32(1)) * x) * np.float32(0.5),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
}
COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}
# Operators IEEE rounds correctly in float32 as in ml_dtypes: NumPy with ml_dtypes gives the
# same bits (transcendentals may differ in float32's last bit between NumPy's SIMD loops and
# the C library ml_dtypes calls).
CORRECTLY_ROUNDED = {"neg": np.negative, "abs": np.abs, "sqrt": np.sqrt, "floor": np.floor,
                     "ceil": np.ceil, "add": np.add, "sub": np.subtract, "mul": np.multiply,
                     "div": np.divide, "maximum": np.maximum, "minimum": np.minimum}


def operands(n: int, size: int = 2000, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size)
        x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 2.5]
        out.append(x.astype(BF16))
    return out


@pytest.mark.parametrize("op", sorted(IN_FLOAT32))
def test_an_operator_computes_in_float32_and_rounds_once(op):
    arity = 2 if op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum") else 1
    args = operands(arity)
    got = apply_op(op, args, "bfloat16", np)
    with np.errstate(all="ignore"):
        want = IN_FLOAT32[op](*[f32(a) for a in args]).astype(BF16)
    assert got.dtype == BF16 and same(got, want)
    out = np.empty(got.shape, BF16)
    assert apply_op(op, args, "bfloat16", np, out=out) is out and same(out, want)
    if op in CORRECTLY_ROUNDED:
        with np.errstate(all="ignore"):
            assert same(got, CORRECTLY_ROUNDED[op](*args))  # ml_dtypes' own loops


@pytest.mark.parametrize("op", sorted(COMPARE))
def test_comparisons_compare_the_values(op):
    a, b = operands(2)
    b[::3] = a[::3]
    got = apply_op(op, [a, b], "bool", np)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, COMPARE[op](f32(a), f32(b)))


def test_mixed_operands_compute_in_the_result_dtype():
    (a,) = operands(1)
    x32 = np.random.default_rng(1).standard_normal(a.size).astype(np.float32)
    x64 = x32.astype(np.float64) / 3
    i8 = np.arange(a.size, dtype=np.int64).astype(np.int8)
    with np.errstate(all="ignore"):
        assert np.array_equal(apply_op("mul", [a, x32], "float32", np), f32(a) * x32,
                              equal_nan=True)
        assert np.array_equal(apply_op("add", [a, x64], "float64", np),
                              a.astype(np.float64) + x64, equal_nan=True)
        assert same(apply_op("add", [a, i8], "bfloat16", np), (f32(a) + i8).astype(BF16))
        half = x32.astype(np.float16)
        assert np.array_equal(apply_op("sub", [a, half], "float32", np), f32(a) - half,
                              equal_nan=True)


def test_where_and_cast_keep_bits_and_round_once():
    a, b = operands(2)
    cond = np.arange(a.size) % 3 == 0
    got = apply_op("where", [cond, a, constant(0.1, "bfloat16")], "bfloat16", np)
    assert same(got, np.where(cond, a, np.asarray(exact_bfloat16(0.1), BF16)))
    wide = np.random.default_rng(2).standard_normal(500) * 1e3
    wide[:3] = [1 + 2**-8 + 2**-30, np.nan, -np.inf]
    got = apply_op("cast", [wide], "bfloat16", np)
    np.testing.assert_array_equal(got.astype(np.float64), [exact_bfloat16(v) for v in wide])
    assert apply_op("cast", [got], "float64", np).dtype == np.float64


def test_constants_round_once():
    assert constant(1 + 2**-8 + 2**-30, "bfloat16").dtype == BF16
    assert float(constant(1 + 2**-8 + 2**-30, "bfloat16")) == 1 + 2**-7


def test_bfloat16_is_refused_on_other_array_modules():
    class FakeModule:  # anything but NumPy
        pass
    with pytest.raises(ExecutionError, match="CPU workers only"):
        apply_op("add", operands(2), "bfloat16", FakeModule())


# -- fused programs --------------------------------------------------------------------------
UNARY = ["neg", "abs", "exp", "tanh", "sigmoid", "gelu", "relu", "sin", "floor", "sqrt"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]


@st.composite
def programs(draw):
    """A random program on a bfloat16 input (in0), a float32 input (in1) and bfloat16
    constants, every instruction's dtype the IR's rule."""
    program, kinds = [], []

    def arg():
        numbers = [j for j, k in enumerate(kinds) if k != "bool"]
        pick = draw(st.integers(0, len(numbers) + 2))
        if pick == 0:
            return ("in", 0), "bfloat16"
        if pick == 1:
            return ("in", 1), "float32"
        if pick == 2:
            return ("c", draw(st.floats(-4, 4, allow_nan=False)), "bfloat16"), "bfloat16"
        j = numbers[pick - 3]
        return ("t", j), kinds[j]

    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "where", "cast"]))
        if kind == "unary":
            (a, da) = arg()
            ins, dtype = (draw(st.sampled_from(UNARY)), (a,)), da
        elif kind == "binary":
            (a, da), (b, db) = arg(), arg()
            dtype = "float32" if "float32" in (da, db) else "bfloat16"
            ins = (draw(st.sampled_from(BINARY)), (a, b))
        elif kind == "where":
            (a, da), (b, db), (c, dc) = arg(), arg(), arg()
            program.append(("lt", (a, b), "bool"))
            kinds.append("bool")
            dtype = "float32" if "float32" in (dc, da) else "bfloat16"
            ins = ("where", (("t", len(program) - 1), c, a))
        else:
            (a, _) = arg()
            dtype = draw(st.sampled_from(["bfloat16", "float32"]))
            ins = ("cast", (a,))
        program.append((ins[0], ins[1], dtype))
        kinds.append(dtype)
    return tuple(program)


def reference(program, arrays):
    """Op by op in NumPy: every instruction computed in float32 from its widened operands
    (bool for comparisons), rounded to bfloat16 where its dtype says so."""
    values = []
    for op, args, dtype in program:
        xs = [arrays[a[1]] if a[0] == "in" else values[a[1]] if a[0] == "t" else
              np.asarray(exact_bfloat16(a[1]), BF16) for a in args]
        wide = [x if x.dtype == bool else f32(x) for x in xs]
        with np.errstate(all="ignore"):
            if op == "cast":
                value = wide[0]
            elif op == "where":
                value = np.where(*wide)
            elif op == "lt":
                value = np.less(*wide)
            else:
                value = IN_FLOAT32[op](*wide)
        values.append(value if dtype == "bool" else np.asarray(value).astype(dtype))
    return values[-1]


@settings(max_examples=150, deadline=None)
@given(programs(), st.integers(0, 2**16))
def test_fused_programs_round_after_every_bfloat16_instruction(program, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((64, 33)) * 4).astype(BF16)
    y = (rng.standard_normal((33,)) * 4).astype(np.float32)
    want = reference(program, [x, y])
    for evaluate in (fused_cpu.evaluate, fused_cpu.evaluate_blocked):
        got = evaluate(program, [x, y], (64, 33)) if evaluate is fused_cpu.evaluate \
            else evaluate(program, [x, y], (64, 33), 100)  # blocks of 100 elements
        assert got.dtype == want.dtype and got.shape == (64, 33)
        if want.dtype == BF16:
            assert same(got, np.broadcast_to(want, got.shape))
        else:  # float32 (exact, but for numexpr's own float32 libm on a float32-only program)
            np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-6,
                                       equal_nan=True)


def test_numexpr_leaves_bfloat16_to_the_blocked_path():
    """numexpr has no bfloat16: a program reading or making it is not lowered (a final cast
    to bfloat16 included, which NumPy's casting would round twice from float64)."""
    assert fused_numexpr.numexpr_source((("exp", (("in", 0),), "bfloat16"),),
                                        ("bfloat16",)) is None
    to_bf16 = (("mul", (("in", 0), ("in", 0)), "float64"),
               ("cast", (("t", 0),), "bfloat16"))
    assert fused_numexpr.numexpr_source(to_bf16, ("float64",)) is None
    x = np.full(4, 1 + 2**-8 + 2**-30, np.float64) ** 0.5
    got = fused_cpu.evaluate(to_bf16, [x], (4,))
    np.testing.assert_array_equal(got.astype(np.float64), [exact_bfloat16(v * v) for v in x])


def test_a_fused_softmax_gives_the_bits_of_the_softmax_task():
    from deepx_flow.kernels import tasks
    x = (np.random.default_rng(3).standard_normal((37, 300)) * 3).astype(BF16)
    for op in ("softmax", "log_softmax"):
        task = tasks.softmax_chunk(op, 1, ((),), x)
        fused = fused_cpu.evaluate(((op, (("in", 0), ("c", 1, "int64")), "bfloat16"),), [x],
                                   x.shape)
        assert task.dtype == fused.dtype == BF16 and same(task, fused)
        xs = x.astype(np.float64)
        e = np.exp(xs - xs.max(1, keepdims=True))
        want = e / e.sum(1, keepdims=True) if op == "softmax" else \
            np.log(e / e.sum(1, keepdims=True))
        np.testing.assert_allclose(task.astype(np.float64), want, rtol=2**-7, atol=1e-6)
