"""fused_gpu.kernel_source without a GPU: the shape of the generated kernel, and its meaning.

The meaning is checked by compiling the generated bodies as C++ on the host (g++), with
stand-ins for the few CUDA names they use (`__device__`, `__int_as_float`,
`__longlong_as_double`) and for CuPy's `float16` storage type, then running them over NumPy
arrays and comparing with the same float64 references as the CPU engines. This checks the
typing, conversions, literals, NaN rules and formulas of the kernels; it cannot check CUDA's
math library or NVRTC, which `tests/gpu` does when a device exists.
"""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels import fused_gpu
from tests.kernels.cases import (CHAIN10, ALL_CASES, assert_matches, case_id, fused, operands,
                                 reference)


def test_a_ten_op_chain_is_one_kernel():
    in_params, out_params, body = fused_gpu.kernel_source(CHAIN10, ("float32", "float32"))
    assert in_params == "float32 in0, float32 in1"
    assert out_params == "float32 out0"
    lines = body.splitlines()
    # one statement per instruction, each stored in a typed register, then the store
    assert len(lines) == 11 and lines[-1] == "out0 = t9;"
    assert all(line.startswith(f"const float t{j} = ") for j, line in enumerate(lines[:10]))
    assert "double" not in body  # float32 programs stay float32 (typed literals)
    assert fused_gpu.kernel_name(CHAIN10, ("float32", "float32")).startswith("dx_fused_")


def test_unread_inputs_are_not_parameters_and_float16_computes_in_float():
    program = (("exp", (("in", 2),), "float16"), ("add", (("t", 0), ("in", 0)), "float16"))
    in_params, out_params, body = fused_gpu.kernel_source(
        program, ("float16", "int64", "float16"))
    assert in_params == "float16 in0, float16 in2"
    assert out_params == "float16 out0"
    assert "const float16 t0 = float16(exp(((float)(in2))));" in body


def test_literals_are_exact_and_typed():
    lit = fused_gpu.literal
    assert lit(0.1, "float32") == f"((float){float(np.float32(0.1))!r})"
    assert lit(0.1, "float64") == "((double)0.1)"
    assert lit(70000.0, "float16") == "__int_as_float(2139095040)"  # rounds to +inf
    assert lit(float("nan"), "float64") == "__longlong_as_double(9221120237041090560LL)"
    assert lit(float("-inf"), "float32") == "__int_as_float(-8388608)"
    assert lit(-2**63, "int64") == "(-9223372036854775807LL - 1LL)"
    assert lit(2**64 - 1, "uint64") == "((unsigned long long)18446744073709551615ULL)"
    assert lit(True, "bool") == "true"
    assert lit(-3, "int8") == "((signed char)-3LL)"


def test_bad_programs_raise():
    with pytest.raises(ExecutionError, match="empty fused program"):
        fused_gpu.kernel_source((), ())
    with pytest.raises(ExecutionError, match="reads input 1"):
        fused_gpu.kernel_source((("neg", (("in", 1),), "float32"),), ("float32",))
    with pytest.raises(ExecutionError, match="unknown elementwise operator"):
        fused_gpu.kernel_source((("lgamma", (("in", 0),), "float32"),), ("float32",))


# --- compile the generated kernels on the host ------------------------------------------------

HOST_PRELUDE = r"""
#include <cmath>
#include <cstring>
#define __device__
using std::exp; using std::log; using std::sqrt; using std::tanh; using std::pow; using std::erf;
using std::fabs; using std::sin; using std::cos; using std::tan; using std::floor;
using std::ceil; using std::rint; using std::log1p; using std::sinh; using std::cosh;
using std::asinh; using std::acosh; using std::atanh;

// CuPy's float16: a storage type, built implicitly from float only, read as float.
class float16 {
    _Float16 v_;
  public:
    float16() {}
    float16(float v) : v_((_Float16)v) {}
    explicit float16(double v) : v_((_Float16)(float)v) {}
    explicit float16(bool v) : v_((_Float16)(float)v) {}
    explicit float16(int v) : v_((_Float16)(float)v) {}
    explicit float16(long long v) : v_((_Float16)(float)v) {}
    operator float() const { return (float)v_; }
};
static_assert(sizeof(float16) == 2, "float16 must be 2 bytes");
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
"""


def _host_function(name, program, in_dtypes):
    in_params, out_params, body = fused_gpu.kernel_source(program, in_dtypes)
    lines = [f'extern "C" void {name}(void** ins, void* out, long n) {{',
             "  for (long e = 0; e < n; ++e) {"]
    for i, param in enumerate(p for p in in_params.split(", ") if p):
        dtype, var = param.split()
        ct = fused_gpu.CTYPES[dtype]
        lines.append(f"    const {ct} {var} = ((const {ct}*)ins[{i}])[e];")
    out_dtype, _ = out_params.split()
    ct = fused_gpu.CTYPES[out_dtype]
    lines.append(f"    {ct} out0;")
    lines += ["    " + line for line in body.splitlines()]
    lines += [f"    (({ct}*)out)[e] = out0;", "  }", "}"]
    return "\n".join(lines)


CAST_CASES = [(s, d) for s in ("bool", "int8", "uint8", "int32", "int64", "float16",
                               "float32", "float64")
              for d in ("bool", "int8", "uint8", "int16", "int64", "float16", "float32",
                        "float64") if s != d]
CONST_PROGRAMS = {
    # (x / c) with c = NaN, inf, -0.0, and float32 rounding of a constant
    "div_nan": ((("div", (("in", 0), ("c", float("nan"), "float32")), "float32"),), "float32"),
    "div_inf": ((("div", (("in", 0), ("c", float("inf"), "float64")), "float64"),), "float64"),
    "inv_negzero": ((("div", (("in", 0), ("c", -0.0, "float64")), "float64"),), "float64"),
    "f32_rounding": ((("add", (("in", 0), ("c", 16777217.0, "float32")), "float32"),
                      ("sub", (("t", 0), ("c", 16777217.0, "float32")), "float32")), "float32"),
    "h_const": ((("mul", (("in", 0), ("c", 0.1, "float16")), "float16"),), "float16"),
    "chain10": (CHAIN10, "float32"),
}


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to compile the generated kernel bodies on the host")
    funcs, names = [], {}
    for i, case in enumerate(ALL_CASES):
        op, ins, r = case
        names[case_id(case)] = f"k{i}"
        funcs.append(_host_function(f"k{i}", fused(op, len(ins), r), ins))
    for i, (s, d) in enumerate(CAST_CASES):
        names[f"cast-{s}-{d}"] = f"c{i}"
        funcs.append(_host_function(f"c{i}", (("cast", (("in", 0),), d),), (s,)))
    for key, (program, dtype) in CONST_PROGRAMS.items():
        names[key] = f"p_{key}"
        n_in = 2 if key == "chain10" else 1
        funcs.append(_host_function(f"p_{key}", program, (dtype,) * n_in))
    src = tmp_path_factory.mktemp("kernels") / "kernels.cpp"
    src.write_text(HOST_PRELUDE + fused_gpu.PREAMBLE + "\n\n".join(funcs))
    lib = src.with_suffix(".so")
    # -O1 without -ffast-math: NaN comparisons must behave as IEEE says
    result = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o",
                             str(lib), str(src)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return ctypes.CDLL(str(lib)), names


def _run_host(host_kernels, key, arrays, out_shape, out_dtype):
    lib, names = host_kernels
    arrays = [np.ascontiguousarray(np.broadcast_to(a, out_shape)) for a in arrays]
    out = np.empty(out_shape, dtype=out_dtype)
    ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
    getattr(lib, names[key])(ptrs, ctypes.c_void_p(out.ctypes.data), ctypes.c_long(out.size))
    return out


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_generated_kernel_matches_reference(host_kernels, case):
    op, ins, r = case
    shapes = [(3, 17), (17,), (3, 1)][:len(ins)]
    arrays = [operands(op, ins, s, seed=i)[i] for i, s in enumerate(shapes)]
    got = _run_host(host_kernels, case_id(case), arrays, (3, 17), r)
    assert_matches(got, reference(op, arrays, r), r, what=case_id(case))


@pytest.mark.parametrize("src,dst", CAST_CASES)
def test_generated_casts_match_numpy(host_kernels, src, dst):
    # values every engine converts alike (no NaN or out-of-range float-to-int)
    x = np.array([0, 1, 3, 2.5, -0.0, 100.75, 7, 0.1], dtype=np.float64)
    if np.dtype(src).kind != "u":
        x[2] = -3
    x = x.astype(src)
    got = _run_host(host_kernels, f"cast-{src}-{dst}", [x], x.shape, dst)
    np.testing.assert_array_equal(got, x.astype(dst))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_generated_maximum_minimum_relu_nan_rules(host_kernels, dtype):
    a = np.array([np.nan, 1, np.nan, -np.inf, np.inf, 0.0, 2, -1], dtype=dtype)
    b = np.array([1, np.nan, np.nan, 2, -np.inf, -0.0, 2, np.nan], dtype=dtype)
    for op, want in (("maximum", np.maximum(a, b)), ("minimum", np.minimum(a, b))):
        got = _run_host(host_kernels, f"{op}-{dtype}-{dtype}->{dtype}", [a, b], a.shape, dtype)
        np.testing.assert_array_equal(got, want)
    got = _run_host(host_kernels, f"relu-{dtype}->{dtype}", [a], a.shape, dtype)
    np.testing.assert_array_equal(got, np.maximum(a, 0))


def test_generated_constants(host_kernels):
    x = np.array([1.0, -1.0, 0.0], dtype=np.float32)
    got = _run_host(host_kernels, "div_nan", [x], x.shape, "float32")
    assert np.isnan(got).all()
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(_run_host(host_kernels, "div_inf", [x64], x.shape, "float64"),
                                  [0.0, -0.0, 0.0])
    got = _run_host(host_kernels, "inv_negzero", [x64[:2]], (2,), "float64")
    np.testing.assert_array_equal(got, [-np.inf, np.inf])
    ones = np.ones(4, np.float32)
    np.testing.assert_array_equal(_run_host(host_kernels, "f32_rounding", [ones], (4,),
                                            "float32"), np.zeros(4, np.float32))
    h = np.array([1, 2, 3], dtype=np.float16)
    np.testing.assert_array_equal(_run_host(host_kernels, "h_const", [h], (3,), "float16"),
                                  h * np.float16(0.1))


def test_generated_ten_op_chain(host_kernels):
    from deepx_flow.kernels import fused_cpu
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (64, 33)).astype(np.float32)
    y = rng.uniform(-2, 2, (33,)).astype(np.float32)
    got = _run_host(host_kernels, "chain10", [x, y], x.shape, "float32")
    want = fused_cpu.evaluate_blocked(CHAIN10, [x, y], x.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
