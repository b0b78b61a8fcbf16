"""Shared test material for the kernels: operand generators, float64 references, tolerances.

The references are written independently of `deepx_flow.kernels.elementwise`: floating results
are computed in float64 from the formula of each operator, integer and bool results with exact
int64 arithmetic wrapped to the result dtype.
"""

from __future__ import annotations

import math

import numpy as np

from deepx_flow.ir import dtypes
from deepx_flow.ops.elementwise import BINARY, UNARY

DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64", "uint32", "float16", "float32",
          "float64")
FLOATS = ("float16", "float32", "float64")
# dtypes numexpr computes exactly like NumPy (the numexpr path uses only these)
NE_DTYPES = ("bool", "int32", "int64", "float32", "float64")
MIXED_PAIRS = (("int32", "float32"), ("int64", "float64"), ("bool", "float32"),
               ("int8", "uint8"), ("float16", "float32"), ("int32", "int64"),
               ("bool", "int32"), ("uint8", "float16"), ("float32", "float64"),
               ("int16", "float64"))

# (rtol, atol) of one operator's float result against the float64 reference
TOL = {"float16": (1e-2, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}

GELU_K = math.sqrt(2 / math.pi)


def result_dtype(op: str, in_dtypes: tuple[str, ...]) -> str | None:
    """The instruction dtype the IR gives `op` on these operand dtypes, or None if invalid."""
    try:
        if op == "relu":
            return None if in_dtypes[0] == "bool" else in_dtypes[0]
        if op == "where":
            a, b = in_dtypes[1:]
            return a if a == b else dtypes.ufunc_result(np.add, a, b)
        table = UNARY if op in UNARY else BINARY
        return dtypes.ufunc_result(table[op][0], *in_dtypes)
    except TypeError:
        return None


def operands(op: str, in_dtypes: tuple[str, ...], shape, seed: int = 0) -> list[np.ndarray]:
    """Inputs inside the operator's domain (positive for log/sqrt, small for exp and pow)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, d in enumerate(in_dtypes):
        if d == "bool":
            out.append(rng.random(shape) < 0.5)
            continue
        kind = np.dtype(d).kind
        if op in ("log", "sqrt"):
            lo, hi = (1, 40) if kind in "iu" else (0.05, 20.0)
        elif op == "pow":
            if kind in "iu":
                lo, hi = ((0, 6) if kind == "u" else (-5, 6)) if i == 0 else (0, 4)
            else:
                lo, hi = (0.2, 3.0) if i == 0 else (-2.0, 2.0)
        elif op == "div" and i == 1:
            lo, hi = (1, 20) if kind in "iu" else (0.5, 4.0)
        elif op in ("exp", "sigmoid", "gelu", "tanh", "erf", "softplus"):
            lo, hi = (-4, 5) if kind in "iu" else (-4.0, 4.0)
        elif op == "tan":  # away from the poles at +-pi/2
            lo, hi = (-1, 2) if kind in "iu" else (-1.3, 1.3)
        elif op == "reciprocal":  # away from zero, both signs
            lo, hi = (1, 20) if kind in "iu" else (0.25, 4.0)
        elif op in ("sinh", "cosh"):  # no overflow in float16
            lo, hi = (-4, 5) if kind in "iu" else (-4.0, 4.0)
        elif op == "acosh":  # its domain: [1, inf)
            lo, hi = (1, 20) if kind in "iu" else (1.0, 20.0)
        elif op == "atanh":  # its domain: (-1, 1); the integers in it are 0
            lo, hi = (0, 1) if kind in "iu" else (-0.95, 0.95)
        else:
            lo, hi = (-10, 11) if kind in "iu" else (-3.0, 3.0)
        if kind == "u":
            lo = max(lo, 0)
        if kind in "iu":
            values = rng.integers(lo, hi, size=shape)
        else:
            values = rng.uniform(lo, hi, size=shape)
        if op == "reciprocal" and kind != "u":
            values = values * rng.choice([-1, 1], size=shape)
        if op in ("round", "floor", "ceil", "sign") and kind == "f":
            # whole numbers, halves (which round to even) and zeros among the draws
            values = np.where(rng.random(shape) < 0.5, np.round(values * 2) / 2, values)
            values = np.where(rng.random(shape) < 0.1, 0.0, values)
        out.append(values.astype(d))
    return out


def reference(op: str, arrays: list[np.ndarray], rdtype: str) -> np.ndarray:
    """`op` on `arrays` computed in float64 (float results) or exactly (integer and bool)."""
    if np.dtype(rdtype).kind == "f":
        xs = [np.asarray(a, dtype=np.float64) for a in arrays]
        with np.errstate(all="ignore"):
            return _float64(op, xs)
    # Comparisons of floats compare the float values (exact in float64); everything else with
    # an integer or bool result is integer arithmetic, done in int64 and wrapped to rdtype.
    floats = any(np.asarray(a).dtype.kind == "f" for a in arrays)
    xs = [np.asarray(a).astype(np.float64 if floats else np.int64) for a in arrays]
    with np.errstate(all="ignore"):
        r = _exact(op, xs)
    return r.astype(rdtype)


def _float64(op, xs):
    a = xs[0]
    b = xs[1] if len(xs) > 1 else None
    formulas = {
        "neg": lambda: -a, "abs": lambda: np.abs(a), "exp": lambda: np.exp(a),
        "log": lambda: np.log(a), "sqrt": lambda: np.sqrt(a), "tanh": lambda: np.tanh(a),
        "sigmoid": lambda: 1.0 / (1.0 + np.exp(-a)), "relu": lambda: np.where(a < 0, 0.0, a),
        "gelu": lambda: 0.5 * a * (1.0 + np.tanh(GELU_K * (a + 0.044715 * a ** 3))),
        "erf": lambda: np.vectorize(math.erf, otypes=[np.float64])(a),
        "sin": lambda: np.sin(a), "cos": lambda: np.cos(a), "tan": lambda: np.tan(a),
        "floor": lambda: np.floor(a), "ceil": lambda: np.ceil(a),
        "round": lambda: _half_even(a), "sign": lambda: np.sign(a),
        "reciprocal": lambda: 1.0 / a,
        "sinh": lambda: np.vectorize(math.sinh, otypes=[np.float64])(a),
        "cosh": lambda: np.vectorize(math.cosh, otypes=[np.float64])(a),
        # written out (NaN outside the domain, as from a bool operand's 0; inf at atanh(1))
        "asinh": lambda: np.sign(a) * np.log1p(np.abs(a) + a * a / (1 + np.sqrt(1 + a * a))),
        "acosh": lambda: np.log(a + np.sqrt((a - 1) * (a + 1))),
        "atanh": lambda: 0.5 * np.log1p(2 * a / (1 - a)),
        "softplus": lambda: np.where(a > 0, a + np.log1p(np.exp(-a)), np.log1p(np.exp(a))),
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / b,
        "pow": lambda: a ** b,
        "maximum": lambda: np.where(np.isnan(a) | np.isnan(b), np.nan, np.where(a >= b, a, b)),
        "minimum": lambda: np.where(np.isnan(a) | np.isnan(b), np.nan, np.where(a <= b, a, b)),
        "where": lambda: np.where(xs[0] != 0, xs[1], xs[2]),
    }
    return formulas[op]()


def _half_even(a):
    """Round to the nearest integer, halves to the even one, written out (not np.rint)."""
    low = np.floor(a)
    frac = a - low
    up = (frac > 0.5) | ((frac == 0.5) & (np.mod(low, 2) == 1))
    return low + up


def _exact(op, xs):
    a = xs[0]
    b = xs[1] if len(xs) > 1 else None
    formulas = {
        "neg": lambda: -a, "abs": lambda: np.abs(a), "relu": lambda: np.where(a < 0, 0, a),
        "floor": lambda: a, "ceil": lambda: a, "round": lambda: a,
        "sign": lambda: (a > 0).astype(np.int64) - (a < 0).astype(np.int64),
        "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
        "pow": lambda: a ** b, "maximum": lambda: np.where(a >= b, a, b),
        "minimum": lambda: np.where(a <= b, a, b), "lt": lambda: a < b, "le": lambda: a <= b,
        "gt": lambda: a > b, "ge": lambda: a >= b, "eq": lambda: a == b, "ne": lambda: a != b,
        "where": lambda: np.where(xs[0] != 0, xs[1], xs[2]),
    }
    return formulas[op]()


def assert_matches(actual: np.ndarray, expected: np.ndarray, rdtype: str, scale: float = 1.0,
                   what: str = "") -> None:
    """Same dtype and shape, and values within the tolerance of `rdtype` (exact for ints)."""
    assert actual.dtype == np.dtype(rdtype), f"{what}: dtype {actual.dtype} != {rdtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if np.dtype(rdtype).kind == "f":
        rtol, atol = TOL[rdtype]
        np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=rtol * scale,
                                   atol=atol * scale, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def unary_cases() -> list[tuple[str, tuple[str, ...], str]]:
    out = []
    for op in list(UNARY):
        for d in DTYPES:
            r = result_dtype(op, (d,))
            if r is not None:
                out.append((op, (d,), r))
    return out


def binary_cases() -> list[tuple[str, tuple[str, ...], str]]:
    pairs = [(d, d) for d in DTYPES] + list(MIXED_PAIRS)
    out = []
    for op in BINARY:
        for pair in pairs:
            r = result_dtype(op, pair)
            if r is not None:
                out.append((op, pair, r))
    return out


def where_cases() -> list[tuple[str, tuple[str, ...], str]]:
    pairs = [(d, d) for d in DTYPES] + list(MIXED_PAIRS)
    return [("where", ("bool",) + p, result_dtype("where", ("bool",) + p)) for p in pairs]


ALL_CASES = unary_cases() + binary_cases() + where_cases()


def case_id(case) -> str:
    op, ins, r = case
    return f"{op}-{'-'.join(ins)}->{r}"


def fused(op: str, n_in: int, rdtype: str) -> tuple:
    """A one-instruction program applying `op` to inputs 0..n_in-1."""
    return ((op, tuple(("in", k) for k in range(n_in)), rdtype),)


def chain10(dtype: str = "float32"):
    """A 10-instruction fused program over two inputs, in `dtype`; several kernel tests (CPU,
    generated GPU source, and on a device) share it."""
    return (
        ("mul", (("in", 0), ("c", 1.5, dtype)), dtype),
        ("add", (("t", 0), ("in", 1)), dtype),
        ("tanh", (("t", 1),), dtype),
        ("sub", (("t", 2), ("in", 0)), dtype),
        ("exp", (("t", 3),), dtype),
        ("maximum", (("t", 4), ("in", 1)), dtype),
        ("sigmoid", (("t", 5),), dtype),
        ("gelu", (("t", 6),), dtype),
        ("div", (("t", 7), ("c", 3.0, dtype)), dtype),
        ("relu", (("t", 8),), dtype),
    )


CHAIN10 = chain10()
