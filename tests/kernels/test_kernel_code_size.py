"""Generated code grows linearly with the program, on the CPU (numexpr) and the GPU (CUDA).

Several operators name their operand more than once (maximum spells out NumPy's NaN rule,
gelu reads x five times, relu twice). The numexpr lowering once wrote the whole expression of
an operand at each of those places, so a chain of maxima grew about 4x per operator (201 M
characters at 12) until the worker ran out of memory. Each value is now written out once and
read by name where it is needed again (a temporary, not a copy), so code size is at most a
constant per instruction; and the results still match NumPy in float64.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepx_flow.errors import CodegenError
from deepx_flow.kernels import fused_cpu, fused_gpu, fused_numexpr
from deepx_flow.kernels.attempt import classify
from deepx_flow.runtime.failures import task_failure
from tests.kernels.test_kernel_fused_cpu import plain_numpy, programs

# Characters of generated code per instruction that no program may pass. The longest
# template (gelu) is about 90 characters around 5 operands, each written out in full only
# while it is at most INLINE_CHARS long.
CPU_CHARS_PER_OP = 120 + 5 * fused_numexpr.INLINE_CHARS
GPU_CHARS_PER_OP = 200
LENGTHS = (6, 12, 24, 48)
N_INPUTS = 3


def chain(kind: str, n: int, dtype: str = "float64"):
    """n instructions, each reading the one before (and an input, for binary operators)."""
    program = []
    for j in range(n):
        op = kind if kind != "mix" else ("maximum", "gelu", "relu", "minimum", "add")[j % 5]
        prev = ("t", j - 1) if j else ("in", 0)
        if op in ("maximum", "minimum", "add"):
            args = (prev, ("in", (j + 1) % N_INPUTS))
        else:
            args = (prev,)
        program.append((op, args, dtype))
    return tuple(program)


def inputs(dtype="float64", shape=(9, 13), seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-3, 3, shape).astype(dtype) for _ in range(N_INPUTS)]
    arrays[1][0, :3] = np.nan  # maximum and minimum must carry NaN as NumPy does
    return arrays


@pytest.mark.parametrize("kind", ["maximum", "minimum", "gelu", "relu", "mix"])
def test_numexpr_code_grows_linearly_and_matches_numpy(kind):
    arrays = inputs()
    sizes = []
    for n in LENGTHS:
        program = chain(kind, n)
        src = fused_cpu.numexpr_source(program, ("float64",) * N_INPUTS)
        assert src is not None, f"{kind} x {n} should lower to numexpr"
        assert src.chars <= CPU_CHARS_PER_OP * n, (kind, n, src.chars)
        sizes.append(src.chars)
        want = plain_numpy(program, arrays)
        for block in (fused_cpu.BLOCK_ELEMENTS, 10):  # one block, and many ragged ones
            got = fused_cpu.evaluate_numexpr(program, arrays, want.shape, block_elements=block)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    # doubling the program at most doubles its code (give or take a stage's worth)
    for (n1, s1), (n2, s2) in zip(zip(LENGTHS, sizes), zip(LENGTHS[1:], sizes[1:])):
        assert s2 <= (n2 / n1) * s1 + CPU_CHARS_PER_OP, (kind, sizes)


@pytest.mark.parametrize("kind", ["maximum", "minimum", "gelu", "relu", "mix"])
def test_cuda_source_grows_linearly_one_statement_per_instruction(kind):
    for n in LENGTHS:
        program = chain(kind, n, "float32")
        _, _, body = fused_gpu.kernel_source(program, ("float32",) * N_INPUTS)
        assert len(body) <= GPU_CHARS_PER_OP * n, (kind, n, len(body))
        lines = body.splitlines()
        assert len(lines) == n + 1 and lines[-1] == f"out0 = t{n - 1};"
        for j, line in enumerate(lines[:-1]):
            # each statement reads earlier registers by name, never their formulas
            assert line.startswith(f"const float t{j} = ") and len(line) <= GPU_CHARS_PER_OP
            if j:
                assert f"t{j - 1}" in line


def test_a_program_of_ten_thousand_instructions_lowers_in_stages():
    program = chain("mix", 10_000)
    src = fused_cpu.numexpr_source(program, ("float64",) * N_INPUTS)
    assert src.chars <= CPU_CHARS_PER_OP * len(program)
    for stage in src.stages:
        assert len(stage.expression) <= fused_numexpr.MAX_EXPR_CHARS
        assert fused_numexpr._depth(stage.expression) <= fused_numexpr.MAX_EXPR_DEPTH
        assert len(stage.signature) <= fused_numexpr.MAX_NUMEXPR_OPERANDS
    arrays = inputs(shape=(4, 5))
    want = plain_numpy(program, arrays)
    got = fused_cpu.evaluate_numexpr(program, arrays, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@st.composite
def long_programs(draw):
    """Random float64 programs of up to 80 instructions that read recent values again and
    again: deep chains, values read by several instructions, and the same value twice."""
    ops = ("maximum", "minimum", "add", "sub", "mul", "gelu", "relu", "tanh", "neg", "abs",
           "sigmoid")
    program = []
    for j in range(draw(st.integers(1, 80))):
        values = [("in", k) for k in range(N_INPUTS)] + [("t", i) for i in range(j)]
        recent = values[-4:]
        op = draw(st.sampled_from(ops))
        a = draw(st.sampled_from(recent))
        if op in ("maximum", "minimum", "add", "sub", "mul"):
            b = draw(st.sampled_from(recent + [("c", 0.5, "float64")]))
            args = (a, b)
        else:
            args = (a,)
        program.append((op, args, "float64"))
    return tuple(program)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=long_programs(), seed=st.integers(0, 2**16))
def test_random_programs_have_linear_code_and_numpy_results(program, seed):
    src = fused_cpu.numexpr_source(program, ("float64",) * N_INPUTS)
    assert src is not None
    assert src.chars <= CPU_CHARS_PER_OP * len(program)
    _, _, body = fused_gpu.kernel_source(program, ("float64",) * N_INPUTS)
    assert len(body) <= GPU_CHARS_PER_OP * len(program) + 20
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-1, 1, (5, 7)) for _ in range(N_INPUTS)]
    with np.errstate(all="ignore"):  # mul chains may overflow to inf, as in NumPy
        want = plain_numpy(program, arrays)
    scale = max(1.0, float(np.max(np.abs(want[np.isfinite(want)]), initial=1.0)))
    for got in (fused_cpu.evaluate_numexpr(program, arrays, want.shape, block_elements=8),
                fused_cpu.evaluate(program, arrays, want.shape)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * scale)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=programs(), seed=st.integers(0, 2**16))
def test_programs_cut_into_many_stages_keep_every_dtype(monkeypatch, case, seed):
    # Tiny stage limits put nearly every instruction in a stage of its own: float32, float64
    # and bool results (comparisons feeding where) pass between stages in block buffers.
    monkeypatch.setattr(fused_numexpr, "INLINE_CHARS", 0)
    monkeypatch.setattr(fused_numexpr, "MAX_EXPR_DEPTH", 4)
    program, in_dtypes, shapes = case
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-2, 2, s).astype(d) for s, d in zip(shapes, in_dtypes)]
    out_shape = tuple(np.broadcast_shapes(*shapes))
    want = fused_cpu.evaluate_blocked(program, arrays, out_shape)
    src = fused_cpu.numexpr_source(program, tuple(in_dtypes))
    if src is None:
        return  # an operation numexpr cannot compute exactly, or one deeper than 4 alone
    assert all(fused_numexpr._depth(s.expression) <= 4 for s in src.stages)
    got = fused_cpu.evaluate_numexpr(program, arrays, out_shape, block_elements=5)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if "float32" in str(src) else 1e-12,
                               atol=1e-6)


def test_a_bool_stage_feeds_two_selections(monkeypatch):
    monkeypatch.setattr(fused_numexpr, "INLINE_CHARS", 0)  # every value read twice: a stage
    program = (("tanh", (("in", 0),), "float32"),
               ("cast", (("t", 0),), "float64"),
               ("gt", (("t", 1), ("in", 1)), "bool"),
               ("where", (("t", 2), ("t", 1), ("in", 1)), "float64"),
               ("where", (("t", 2), ("in", 1), ("t", 3)), "float64"),
               ("cast", (("t", 4),), "float32"))
    src = fused_cpu.numexpr_source(program, ("float32", "float64"))
    assert [s.dtype for s in src.stages] == ["float64", "bool", "float64"]
    rng = np.random.default_rng(5)
    x, y = rng.uniform(-2, 2, (6, 7)).astype(np.float32), rng.uniform(-1, 1, (7,))
    t = np.tanh(x).astype(np.float64)
    want = np.where(t > y, y, np.where(t > y, t, y)).astype(np.float32)
    for block in (3, 1000):
        got = fused_cpu.evaluate_numexpr(program, [x, y], want.shape, block_elements=block)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)  # numexpr's float32 tanh: ~1 ulp


# --- code-generation failures -----------------------------------------------------------------

def deep_chain(n, c):
    """n float64 add/sub instructions in a chain: one expression n parentheses deep."""
    program = [("add", (("in", 0), ("c", c, "float64")), "float64")]
    for j in range(n - 1):
        program.append(("sub" if j % 2 else "add", (("t", j), ("in", 0)), "float64"))
    return tuple(program)


def test_generated_code_numexpr_refuses_is_a_codegen_error_not_oom(monkeypatch):
    # Lift the generator's depth limit past Python's parser, which numexpr compiles with: the
    # generated expression then really fails to compile (201 nested parentheses). That must
    # come back as a code-generation failure, not be hidden by the blocked path and not be
    # taken for running out of memory.
    monkeypatch.setattr(fused_numexpr, "MAX_EXPR_DEPTH", 10_000)
    monkeypatch.setattr(fused_numexpr, "MAX_EXPR_CHARS", 10**7)
    program = deep_chain(300, 0.123456789)  # a constant no other test uses: nothing cached
    src = fused_cpu.numexpr_source(program, ("float64",))
    assert len(src.stages) == 1 and fused_numexpr._depth(src.stages[0].expression) > 200
    x = np.linspace(-1, 1, 11)
    with pytest.raises(CodegenError, match="compiling the numexpr code of a fused program of "
                                           "300 instructions failed .*SyntaxError") as info:
        fused_cpu.evaluate_numexpr(program, [x], x.shape)
    assert classify(info.value) == "codegen"
    failure = task_failure(None, ("fused-1@abc", 0), info.value)
    assert failure.kind == "codegen" and "ran out of memory" not in str(failure)


def test_a_memory_error_while_compiling_code_is_not_oom():
    # Python's parser gives up on deeply nested code with a MemoryError: a real one, raised
    # by compiling code, which classify once reported as "oom" (and the run was planned again)
    with pytest.raises(MemoryError) as parser:
        compile("-" * 100_000 + "x0", "<generated>", "eval")
    program = deep_chain(3, 1.0)
    for err in (fused_cpu._codegen_error(program, "compiling", parser.value),
                fused_gpu.codegen_error(program, "compiling", parser.value)):
        assert isinstance(err, CodegenError) and classify(err) == "codegen"
        assert "MemoryError" in str(err) and "not a lack of memory for the data" in str(err)
    assert classify(parser.value) == "oom"  # a MemoryError of the data still is


def test_the_engine_choice_counts_each_stage_as_a_pass_over_a_block_buffer():
    # float64 add/sub: numexpr is a little cheaper per instruction than the blocked path, so
    # a chain that fits one expression takes numexpr...
    short = deep_chain(20, 1.0)
    assert len(fused_cpu.numexpr_source(short, ("float64",)).stages) == 1
    assert fused_cpu.engine_for(short, ("float64",)) == "numexpr"
    # ...and so does a long one in stages while the stages cost less than numexpr saves
    long = deep_chain(1000, 1.0)
    stages = len(fused_cpu.numexpr_source(long, ("float64",)).stages)
    cost = fused_cpu.estimated_cost(long, stages)
    assert stages > 1 and cost["numexpr"] < cost["blocked"]
    assert fused_cpu.engine_for(long, ("float64",)) == "numexpr"
    # where every value is read four times, nearly every instruction ends a stage
    maxima = chain("maximum", 40)
    stages = len(fused_cpu.numexpr_source(maxima, ("float64",) * N_INPUTS).stages)
    assert stages >= 20
    assert (fused_cpu.estimated_cost(maxima, stages)["numexpr"]
            - fused_cpu.estimated_cost(maxima)["numexpr"]) == pytest.approx(
        (stages - 1) * fused_cpu.OP_COST_NS["cast"][1])
    assert fused_cpu.engine_for(maxima, ("float64",) * N_INPUTS) == "blocked"
    # t = t * t: numexpr saves 0.05 ns per float64 mul, and a stage every few instructions
    # costs more than that, so the blocked path runs it although the table alone says numexpr
    squares = tuple(("mul", (("t", j - 1), ("t", j - 1)) if j else (("in", 0), ("in", 0)),
                     "float64") for j in range(40))
    plain = fused_cpu.estimated_cost(squares)
    assert plain["numexpr"] < plain["blocked"]
    stages = len(fused_cpu.numexpr_source(squares, ("float64",)).stages)
    assert fused_cpu.estimated_cost(squares, stages)["numexpr"] > plain["blocked"]
    assert fused_cpu.engine_for(squares, ("float64",)) == "blocked"
    x = np.array([1.0, -1.0, 1.0 + 2**-40, 0.5, 2.0, np.nan])
    want = x.copy()
    with np.errstate(over="ignore", under="ignore"):
        for _ in squares:
            want = want * want
    np.testing.assert_array_equal(fused_cpu.evaluate(squares, [x], x.shape), want)
