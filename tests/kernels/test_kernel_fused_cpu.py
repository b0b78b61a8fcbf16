"""fused_cpu: both paths (numexpr, blocked) against float64 references, memory, threads."""

import threading
import tracemalloc

import numexpr as ne
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepx_flow.errors import ExecutionError
from deepx_flow.ir.program import whole_axis_ref
from deepx_flow.kernels import fused, fused_cpu, fused_numexpr, tasks
from deepx_flow.kernels.elementwise import apply_op, constant
from tests.kernels.cases import chain10
from tests.kernels.cases import (ALL_CASES, NE_DTYPES, assert_matches, case_id, fused as one_op,
                                 operands, reference)

NE_CASES = [c for c in ALL_CASES if all(d in NE_DTYPES for d in c[1]) and c[2] in NE_DTYPES]

# Cases numexpr cannot run exactly, by design (they take the blocked path): integer pow
# (NumPy raises on negative exponents), bool pow (its result is int8), erf (numexpr has no
# error function) and float round (numexpr's round is not NumPy's rint).
NE_UNSUPPORTED = {("pow", ins, r) for op, ins, r in NE_CASES if op == "pow"
                  and np.dtype(r).kind != "f"} | {c for c in NE_CASES if c[0] == "erf"} | \
    {c for c in NE_CASES if c[0] == "round" and np.dtype(c[2]).kind == "f"}


def _shapes(n):
    return [(3, 17), (17,), (3, 1)][:n]


def _inputs(case):
    op, ins, _ = case
    return [operands(op, ins, s, seed=i)[i] for i, s in enumerate(_shapes(len(ins)))]


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_blocked_path_matches_reference(case):
    op, ins, r = case
    arrays = _inputs(case)
    # 7-element blocks: many blocks, a ragged last one, slices along the last axis
    got = fused_cpu.evaluate_blocked(one_op(op, len(ins), r), arrays, (3, 17), block_elements=7)
    assert_matches(got, reference(op, arrays, r), r, what=case_id(case))


@pytest.mark.parametrize("case", NE_CASES, ids=case_id)
def test_numexpr_path_matches_reference(case):
    op, ins, r = case
    program = one_op(op, len(ins), r)
    if case in NE_UNSUPPORTED:
        assert fused_cpu.numexpr_source(program, ins) is None
        return
    arrays = _inputs(case)
    got = fused_cpu.evaluate_numexpr(program, arrays, (3, 17))
    assert_matches(got, reference(op, arrays, r), r, what=case_id(case))


@pytest.mark.parametrize("case", ALL_CASES[::5], ids=case_id)
def test_evaluate_and_dispatch_match_reference(case):
    op, ins, r = case
    arrays = _inputs(case)
    want = reference(op, arrays, r)
    for f in (fused_cpu.evaluate, fused.evaluate):
        assert_matches(f(one_op(op, len(ins), r), arrays, (3, 17)), want, r, what=case_id(case))


CASTS = [(s, d) for s in NE_DTYPES for d in ("bool", "int8", "int32", "int64", "uint8",
                                             "float16", "float32", "float64") if s != d]


@pytest.mark.parametrize("src,dst", CASTS)
def test_casts_on_every_path(src, dst):
    x = np.array([0, 1, -3, 2.5, -0.0, 100.25, 7], dtype=np.float64).astype(src)
    # a cast inside the program (followed by an add) and a final cast
    inner = (("cast", (("in", 0),), dst),
             ("maximum", (("t", 0), ("t", 0)), dst if dst != "bool" else "bool"))
    for program in (inner, (("cast", (("in", 0),), dst),)):
        want = x.astype(dst)
        np.testing.assert_array_equal(fused_cpu.evaluate_blocked(program, [x], x.shape), want)
        np.testing.assert_array_equal(fused_cpu.evaluate(program, [x], x.shape), want)
        if fused_cpu.numexpr_source(program, (src,)) is not None:
            got = fused_cpu.evaluate_numexpr(program, [x], x.shape)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_numexpr_runs_exact_widening_and_final_casts():
    x = ("in", 0)
    supported = [
        ((("cast", (x,), "float64"),), "int32"),
        ((("cast", (x,), "float32"), ("exp", (("t", 0),), "float32")), "int32"),
        ((("cast", (x,), "float64"), ("exp", (("t", 0),), "float64")), "bool"),
        ((("exp", (x,), "float64"), ("cast", (("t", 0),), "float16")), "float64"),
        ((("mul", (x, x), "int64"), ("cast", (("t", 0),), "int8")), "int64"),
    ]
    for program, d in supported:
        assert fused_cpu.numexpr_source(program, (d,)) is not None, program
    unsupported = [  # narrowing casts inside a program, and odd dtypes
        ((("cast", (x,), "float32"), ("exp", (("t", 0),), "float32")), "float64"),
        ((("exp", (x,), "float16"),), "float16"),
        ((("add", (x, x), "int8"),), "int8"),
    ]
    for program, d in unsupported:
        assert fused_cpu.numexpr_source(program, (d,)) is None, program
        assert fused_cpu.engine_for(program, (d,)) == "blocked"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("path", ["numexpr", "blocked"])
def test_maximum_minimum_relu_nan_and_infinities(dtype, path):
    a = np.array([np.nan, 1, np.nan, -np.inf, np.inf, 0.0, 2, -1], dtype=dtype)
    b = np.array([1, np.nan, np.nan, 2, -np.inf, -0.0, 2, np.nan], dtype=dtype)
    run = fused_cpu.evaluate_numexpr if path == "numexpr" else fused_cpu.evaluate_blocked
    for op, want in (("maximum", np.maximum(a, b)), ("minimum", np.minimum(a, b))):
        got = run(((op, (("in", 0), ("in", 1)), dtype),), [a, b], a.shape)
        np.testing.assert_array_equal(got, want)
    got = run((("relu", (("in", 0),), dtype),), [a], a.shape)
    np.testing.assert_array_equal(got, np.maximum(a, 0))


@pytest.mark.parametrize("path", ["numexpr", "blocked"])
def test_true_division_of_integers(path):
    a = np.array([1, -1, 0, 7, 2**31 - 1], dtype=np.int32)
    b = np.array([0, 0, 0, 2, 3], dtype=np.int64)
    run = fused_cpu.evaluate_numexpr if path == "numexpr" else fused_cpu.evaluate_blocked
    got = run((("div", (("in", 0), ("in", 1)), "float64"),), [a, b], a.shape)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [np.inf, -np.inf, np.nan, 3.5, (2**31 - 1) / 3])


@pytest.mark.parametrize("path", ["numexpr", "blocked"])
def test_float32_constants_stay_float32(path):
    # (x + c) - c with c = 2**24 + 1: c rounds to 2**24 in float32, so the result is 0 where
    # float64 arithmetic (a constant read as a float64 literal) would give 1.
    c = ("c", 16777217.0, "float32")
    program = (("add", (("in", 0), c), "float32"), ("sub", (("t", 0), c), "float32"))
    x = np.ones(5, dtype=np.float32)
    run = fused_cpu.evaluate_numexpr if path == "numexpr" else fused_cpu.evaluate_blocked
    got = run(program, [x], x.shape)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.zeros(5, np.float32))


def test_constants_nan_inf_and_negative_zero_are_kept_apart():
    x = np.array([1.0, -1.0], dtype=np.float64)
    # 1 / (x / c): the sign of a zero shows up as the sign of an infinity
    cases = ((np.nan, [np.nan, np.nan]), (np.inf, [np.inf, -np.inf]),
             (0.0, [0.0, -0.0]), (-0.0, [-0.0, 0.0]))
    for value, want in cases:
        program = (("div", (("in", 0), ("c", value, "float64")), "float64"),
                   ("div", (("c", 1.0, "float64"), ("t", 0)), "float64"))
        for run in (fused_cpu.evaluate_numexpr, fused_cpu.evaluate_blocked, fused_cpu.evaluate):
            got = run(program, [x], x.shape)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_bool_logic_and_where():
    rng = np.random.default_rng(3)
    a, b = rng.random((4, 6)) < 0.5, rng.random((4, 6)) < 0.5
    x = rng.standard_normal((4, 6)).astype(np.float32)
    program = (("add", (("in", 0), ("in", 1)), "bool"),        # or
               ("mul", (("in", 0), ("in", 1)), "bool"),        # and
               ("lt", (("t", 0), ("t", 1)), "bool"),           # ordered bool comparison
               ("where", (("t", 2), ("in", 2), ("c", -1.0, "float32")), "float32"),
               ("where", (("t", 1), ("t", 3), ("in", 2)), "float32"))
    t0, t1 = a | b, a & b
    want = np.where(t1, np.where(t0 < t1, x, np.float32(-1)), x)
    for run in (fused_cpu.evaluate_numexpr, fused_cpu.evaluate_blocked):
        got = run(program, [a, b, x], x.shape)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def chain10_reference(x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    t = np.tanh(x * 1.5 + y) - x
    t = np.maximum(np.exp(t), y)
    t = 1 / (1 + np.exp(-t))
    t = 0.5 * t * (1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t ** 3)))
    return np.maximum(t / 3.0, 0)


@pytest.mark.parametrize("dtype,rtol", [("float16", 2e-2), ("float32", 1e-5),
                                        ("float64", 1e-12)])
def test_ten_op_chain_on_every_path(dtype, rtol):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (64, 33)).astype(dtype)
    y = rng.uniform(-2, 2, (33,)).astype(dtype)
    program = chain10(dtype)
    want = chain10_reference(x, y)
    runs = [fused_cpu.evaluate, fused_cpu.evaluate_blocked,
            lambda p, a, s: fused_cpu.evaluate_blocked(p, a, s, block_elements=100)]
    if dtype != "float16":
        runs.append(fused_cpu.evaluate_numexpr)
    else:
        assert fused_cpu.engine_for(program, (dtype, dtype)) == "blocked"
    for run in runs:
        got = run(program, [x, y], x.shape)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol)


def test_long_chain_runs_in_numexpr_stages_and_stays_exact():
    # 300 instructions nest too deep for one numexpr expression: they run as several, each
    # reading the one before by name
    program = [("add", (("in", 0), ("c", 1.0, "float64")), "float64")]
    for j in range(299):
        program.append(("mul" if j % 2 else "sub", (("t", j), ("in", 0)), "float64"))
    program = tuple(program)
    src = fused_cpu.numexpr_source(program, ("float64",))
    assert len(src.stages) > 1
    assert all(fused_numexpr._depth(s.expression) <= fused_numexpr.MAX_EXPR_DEPTH
               for s in src.stages)
    assert all(("s", i - 1) in s.operands for i, s in enumerate(src.stages) if i)
    x = np.linspace(-1, 1, 50)
    t = x + 1.0
    for j in range(299):
        t = t * x if j % 2 else t - x
    for run in (fused_cpu.evaluate, fused_cpu.evaluate_blocked, fused_cpu.evaluate_numexpr,
                lambda p, a, s: fused_cpu.evaluate_numexpr(p, a, s, block_elements=7)):
        np.testing.assert_allclose(run(program, [x], x.shape), t, rtol=1e-12)


def test_broadcasts_to_a_larger_output_and_returns_a_fresh_array():
    bias = np.arange(5, dtype=np.float32).reshape(1, 5)
    program = (("add", (("in", 0), ("c", 1.0, "float32")), "float32"),)
    for run in (fused_cpu.evaluate, fused_cpu.evaluate_numexpr, fused_cpu.evaluate_blocked):
        got = run(program, [bias], (4, 3, 5))
        assert got.shape == (4, 3, 5) and got.flags.writeable and got.flags.c_contiguous
        np.testing.assert_array_equal(got, np.broadcast_to(bias + 1, (4, 3, 5)))
        got[0, 0, 0] = -1  # writable, and not a view of anything shared
        assert bias[0, 0] == 0
    x = np.ones((2, 3))
    same = fused_cpu.evaluate((("cast", (("in", 0),), "float64"),), [x], x.shape)
    assert same is not x and not np.shares_memory(same, x)


def test_inputs_that_broadcast_against_each_other():
    a = np.arange(6.0).reshape(2, 1, 3)
    b = np.arange(4.0).reshape(4, 1)
    program = (("mul", (("in", 0), ("in", 1)), "float64"),
               ("add", (("t", 0), ("in", 1)), "float64"))
    want = np.broadcast_to(a * b + b, (5, 2, 4, 3))
    for run in (fused_cpu.evaluate, fused_cpu.evaluate_numexpr,
                lambda p, x, s: fused_cpu.evaluate_blocked(p, x, s, block_elements=5)):
        np.testing.assert_array_equal(run(program, [a, b], (5, 2, 4, 3)), want)


def test_constant_only_program_and_zero_size_outputs():
    program = (("add", (("c", 2, "int64"), ("c", 3, "int64")), "int64"),)
    np.testing.assert_array_equal(fused_cpu.evaluate(program, [], (2, 2)), np.full((2, 2), 5))
    empty = fused_cpu.evaluate((("exp", (("in", 0),), "float32"),),
                               [np.zeros((0, 3), np.float32)], (0, 3))
    assert empty.shape == (0, 3) and empty.dtype == np.float32


def test_bad_calls_raise_execution_errors():
    x = np.zeros((2, 3))
    with pytest.raises(ExecutionError, match="empty fused program"):
        fused_cpu.evaluate((), [x], x.shape)
    with pytest.raises(ExecutionError, match="reads input 1"):
        fused_cpu.evaluate((("add", (("in", 0), ("in", 1)), "float64"),), [x], x.shape)
    with pytest.raises(ExecutionError, match=r"do not broadcast to the output shape \(4, 3\)"):
        fused_cpu.evaluate((("exp", (("in", 0),), "float64"),), [x], (4, 3))
    with pytest.raises(ExecutionError, match="reads temporary 3"):
        fused_cpu.evaluate_blocked((("exp", (("t", 3),), "float64"),), [x], x.shape)


# --- one pass over memory ---------------------------------------------------------------------

def _peak(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _long_float64_chain(n_ops):
    program = [("mul", (("in", 0), ("c", 0.5, "float64")), "float64")]
    for j in range(n_ops - 1):
        op = ("add", "tanh", "mul", "sigmoid")[j % 4]
        args = (("t", j),) if op in ("tanh", "sigmoid") else (("t", j), ("in", 0))
        program.append((op, args, "float64"))
    return tuple(program)


def test_fused_evaluation_does_not_allocate_a_temporary_per_instruction():
    x = np.random.default_rng(0).standard_normal(2_500_000)
    program = _long_float64_chain(20)
    out_bytes = x.nbytes
    # compile and warm up first: the measured calls are the steady state of a worker
    fused_cpu.evaluate_blocked(program, [x], x.shape)
    fused_cpu.evaluate_numexpr(program, [x], x.shape)

    def unfused():
        values = []
        for op, args, dtype in program:
            ops = [x if a[0] == "in" else values[a[1]] if a[0] == "t" else constant(a[1], a[2])
                   for a in args]
            values.append(apply_op(op, ops, dtype, np))

    # The control: tracemalloc sees NumPy's full-size temporaries.
    assert _peak(unfused) > 10 * out_bytes
    blocked = _peak(lambda: fused_cpu.evaluate_blocked(program, [x], x.shape))
    # the output plus two reused block buffers (BLOCK_ELEMENTS float64 each) and small change;
    # one more full-size temporary would exceed this
    assert fused_cpu.BLOCK_ELEMENTS * 8 * 4 < out_bytes
    assert blocked < out_bytes + 4 * fused_cpu.BLOCK_ELEMENTS * 8
    numexpr = _peak(lambda: fused_cpu.evaluate_numexpr(program, [x], x.shape))
    assert numexpr < out_bytes + 2**20  # numexpr's own registers are 1024-element blocks


def test_blocked_allocator_reuses_buffers():
    # 40 float64 temporaries in a chain need only two block buffers
    slots, slot_dtypes, scratch = fused_cpu._allocate(_long_float64_chain(40))
    assert slot_dtypes == ["float64", "float64"] and not scratch
    # a value read late keeps its buffer; no instruction writes over one of its operands
    program = (("exp", (("in", 0),), "float64"), ("tanh", (("t", 0),), "float64"),
               ("neg", (("t", 1),), "float64"), ("add", (("t", 2), ("t", 0)), "float64"))
    slots, slot_dtypes, _ = fused_cpu._allocate(program)
    assert len({slots[0], slots[1], slots[2]}) == 3 and len(slot_dtypes) == 3
    x = np.linspace(-1, 1, 30)
    np.testing.assert_allclose(fused_cpu.evaluate_blocked(program, [x], x.shape, 4),
                               -np.tanh(np.exp(x)) + np.exp(x), rtol=1e-14)


# --- blocks -----------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(0, 7), min_size=0, max_size=4).map(tuple),
       block=st.integers(1, 60))
def test_blocks_tile_the_array_exactly_once(shape, block):
    seen = np.zeros(shape, dtype=np.int64)
    for key in fused_cpu.iter_blocks(shape, block):
        view = seen[key]
        assert view.size <= block
        assert view.flags.c_contiguous
        view += 1
    np.testing.assert_array_equal(seen, np.ones(shape, dtype=np.int64))


# --- random programs --------------------------------------------------------------------------

UNARY_SAFE = ("neg", "abs", "tanh", "sigmoid", "relu", "gelu")
BINARY_SAFE = ("add", "sub", "mul", "maximum", "minimum")


@st.composite
def programs(draw):
    """Random float programs with broadcasting inputs, mixed float32/float64, constants, and
    comparisons (of inputs only, so rounding cannot flip a branch) feeding where()."""
    base = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    n_in = draw(st.integers(1, 3))
    in_dtypes = [draw(st.sampled_from(["float32", "float64"])) for _ in range(n_in)]
    shapes = []
    for _ in range(n_in):
        drop = draw(st.integers(0, len(base) - 1))
        shapes.append(tuple(1 if draw(st.booleans()) else s for s in base[drop:]))
    values = [(("in", k), in_dtypes[k]) for k in range(n_in)]
    program = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "const", "where"]))
        a, da = draw(st.sampled_from(values))
        if kind == "unary":
            op, args, d = draw(st.sampled_from(UNARY_SAFE)), (a,), da
        elif kind == "binary":
            b, db = draw(st.sampled_from(values))
            op, args = draw(st.sampled_from(BINARY_SAFE)), (a, b)
            d = np.result_type(da, db).name
        elif kind == "const":
            c = draw(st.floats(-2, 2, allow_nan=False).map(lambda v: round(v, 3)))
            op, args, d = draw(st.sampled_from(BINARY_SAFE)), (a, ("c", c, da)), da
        else:
            k1, k2 = draw(st.integers(0, n_in - 1)), draw(st.integers(0, n_in - 1))
            program.append((draw(st.sampled_from(["lt", "ge", "ne"])),
                            (("in", k1), ("in", k2)),
                            "bool"))
            b, db = draw(st.sampled_from(values))
            op, args = "where", (("t", len(program) - 1), a, b)
            d = np.result_type(da, db).name
        program.append((op, args, d))
        values.append((("t", len(program) - 1), d))
    return tuple(program), in_dtypes, shapes


def plain_numpy(program, arrays):
    """A straightforward float64 interpreter, independent of the kernels."""
    k = np.sqrt(2 / np.pi)
    f = {"neg": np.negative, "abs": np.abs, "tanh": np.tanh,
         "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "relu": lambda a: np.maximum(a, 0),
         "gelu": lambda a: 0.5 * a * (1 + np.tanh(k * (a + 0.044715 * a ** 3))),
         "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
         "minimum": np.minimum, "lt": np.less, "ge": np.greater_equal, "ne": np.not_equal,
         "where": np.where}
    values = []
    for op, args, _ in program:
        xs = [arrays[a[1]].astype(np.float64) if a[0] == "in" else values[a[1]]
              if a[0] == "t" else np.float64(a[1]) for a in args]
        values.append(f[op](*xs))
    return values[-1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=programs(), seed=st.integers(0, 2**16))
def test_random_programs_match_plain_numpy(case, seed):
    program, in_dtypes, shapes = case
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-2, 2, s).astype(d) for s, d in zip(shapes, in_dtypes)]
    out_shape = tuple(np.broadcast_shapes(*shapes))
    want = np.broadcast_to(plain_numpy(program, arrays), out_shape)
    scale = max(1.0, float(np.max(np.abs(want))))
    rdtype = program[-1][2]
    tol = 1e-4 if rdtype == "float32" or "float32" in in_dtypes else 1e-10
    results = [fused_cpu.evaluate_blocked(program, arrays, out_shape, block_elements=5),
               fused_cpu.evaluate(program, arrays, out_shape)]
    if fused_cpu.numexpr_source(program, tuple(in_dtypes)) is not None:
        results.append(fused_cpu.evaluate_numexpr(program, arrays, out_shape))
    for got in results:
        assert got.dtype == np.dtype(rdtype) and got.shape == out_shape
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=programs(), seed=st.integers(0, 2**16), rows=st.integers(1, 3))
def test_a_program_prepared_for_blocks_gives_the_blocked_paths_bits(case, seed, rows):
    """`prepared_blocks` (a reduction's prologue, set up once per task) is the blocked path
    without its per-call set-up: block by block, the same values to the bit, whatever the
    operands' broadcasting, and a ragged last block too."""
    program, in_dtypes, shapes = case
    rng = np.random.default_rng(seed)
    inner = tuple(np.broadcast_shapes(*shapes))
    out_shape = (5,) + inner
    # Every other operand spans the rows; the others are the same for every block.
    shapes = [(5 if i % 2 == 0 else 1,) + (1,) * (len(inner) - len(s)) + s
              for i, s in enumerate(shapes)]
    arrays = [rng.uniform(-2, 2, s).astype(d) for s, d in zip(shapes, in_dtypes)]
    want = fused_cpu.evaluate_blocked(program, arrays, out_shape)
    # What every block shares (instructions of the operands that span no rows) is computed
    # once, as a reduction's prologue hoists it.
    fixed = fused_cpu.hoisted(program, arrays, {k for k, a in enumerate(arrays)
                                                if a.shape[0] == 1})
    run = fused_cpu.prepared_blocks(program, in_dtypes, (rows,) + out_shape[1:], fixed)
    if fused_cpu.engine_for(program, in_dtypes) != "blocked":
        assert run is None  # numexpr's programs keep their own path
        return
    got = np.empty(out_shape, program[-1][2])
    for lo in range(0, 5, rows):
        block = [a[lo:lo + rows] if a.shape[0] == 5 else a for a in arrays]
        run(block, got[lo:lo + rows])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_a_prepared_softmax_in_blocks_of_rows_gives_the_blocked_paths_bits(rows):
    """softmax and log_softmax of one value share its normalization in a prepared program
    too (the entropy of each row's softmax, as bench_workloads computes it)."""
    entropy = (("softmax", (("in", 0), whole_axis_ref(1)), "float32"),
               ("log_softmax", (("in", 0), whole_axis_ref(1)), "float32"),
               ("mul", (("t", 0), ("t", 1)), "float32"),
               ("neg", (("t", 2),), "float32"))
    x = np.random.default_rng(rows).standard_normal((7, 33)).astype(np.float32) * 20
    x[2, 5] = np.inf  # a row with an infinity, as the whole-chunk path gives it
    want = fused_cpu.evaluate_blocked(entropy, [x], x.shape)
    run = fused_cpu.prepared_blocks(entropy, ["float32"], (rows, 33))
    got = np.empty_like(x)
    for lo in range(0, 7, rows):
        run([x[lo:lo + rows]], got[lo:lo + rows])
    np.testing.assert_array_equal(got, want)


def test_a_prepared_program_refuses_bfloat16():
    bf16 = (("add", (("in", 0), ("in", 0)), "bfloat16"),)
    assert fused_cpu.prepared_blocks(bf16, ["bfloat16"], (4, 8)) is None


# --- threads ----------------------------------------------------------------------------------

def test_concurrent_calls_from_many_threads_are_correct():
    program = chain10("float32")
    rng = np.random.default_rng(1)
    inputs = [(rng.uniform(-2, 2, (200, 301)).astype(np.float32),
               rng.uniform(-2, 2, (301,)).astype(np.float32)) for _ in range(6)]
    wants = [fused_cpu.evaluate_blocked(program, list(xy), (200, 301)) for xy in inputs]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                for run in (fused_cpu.evaluate_numexpr, fused_cpu.evaluate):
                    got = run(program, list(inputs[i]), (200, 301))
                    np.testing.assert_allclose(got, wants[i], rtol=1e-5, atol=1e-6)
        except Exception as e:  # collected: an assert in a thread would be lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert ne.get_num_threads() == fused_cpu.NUMEXPR_THREADS


def test_engine_choice_follows_the_cost_table():
    # float32 transcendentals: NumPy's SIMD loops beat numexpr's scalar libm calls
    tanh = (("tanh", (("in", 0),), "float32"),)
    assert fused_cpu.engine_for(tanh, ("float32",)) == "blocked"
    # exp over float64: numexpr's beats NumPy's
    sel = (("exp", (("in", 0),), "float64"),
           ("add", (("t", 0), ("in", 1)), "float64"))
    assert fused_cpu.engine_for(sel, ("float64", "float64")) == "numexpr"
    cost = fused_cpu.estimated_cost(sel)
    assert cost["numexpr"] < cost["blocked"]
    # a float32 select: the branch-free blocked where beats numexpr's
    relu_grad = (("gt", (("in", 0), ("in", 1)), "bool"),
                 ("where", (("t", 0), ("in", 0), ("in", 1)), "float32"))
    assert fused_cpu.engine_for(relu_grad, ("float32", "float32")) == "blocked"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("program_of", [
    lambda d: chain10(d),                                                    # blocked path
    lambda d: (("exp", (("in", 0),), d), ("add", (("t", 0), ("in", 1)), d)),  # float64: numexpr
])
def test_a_result_written_over_its_first_input_is_the_result_into_new_memory(dtype,
                                                                             program_of):
    # A matmul's epilogue overwrites its product: every block is read before it is written.
    program = program_of(dtype)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((700, 900)).astype(dtype)
    b = rng.standard_normal((700, 900)).astype(dtype)
    expected = fused_cpu.evaluate(program, [a, b], a.shape)
    got = fused_cpu.evaluate(program, [a, b], a.shape, out=a)
    assert got is a
    np.testing.assert_array_equal(got, expected)


def test_an_out_array_that_does_not_fit_is_not_used():
    program = chain10("float32")
    a = np.ones((50, 60), np.float32)
    bias = np.ones(60, np.float32)
    read_only = np.zeros((50, 60), np.float32)
    read_only.flags.writeable = False
    for out in (np.zeros((50, 60), np.float64), np.zeros((60, 50), np.float32).T, read_only):
        got = fused_cpu.evaluate(program, [a, bias], a.shape, out=out)
        expected = fused_cpu.evaluate(program, [a, bias], a.shape)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.float32 and got is not out
    # An out of the output's shape when the inputs broadcast to less is not used either.
    small = np.ones((1, 60), np.float32)
    out = np.zeros((50, 60), np.float32)
    got = fused_cpu.evaluate(program, [small, small], (50, 60), out=out)
    assert got is not out and got.shape == (50, 60)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=programs(), seed=st.integers(0, 2**16), data=st.data())
def test_values_hoisted_out_of_the_blocks_change_no_bit(case, seed, data):
    # Instructions reading only inputs that every block shares are computed once
    # (`hoisted`), at their own shape; the blocks then read those values.
    program, in_dtypes, shapes = case
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-2, 2, s).astype(d) for s, d in zip(shapes, in_dtypes)]
    out_shape = tuple(np.broadcast_shapes(*shapes))
    # Blocks of one row of the last axis: the inputs every block shares are those of size 1
    # along every other axis (a row vector, a scalar); some of those are declared shared.
    row = out_shape[-1] if out_shape else 1
    shared = [k for k, s in enumerate(shapes) if all(n == 1 for n in s[:-1])]
    invariant = set(data.draw(st.sets(st.sampled_from(shared)))) if shared else set()
    fixed = fused_cpu.hoisted(program, arrays, invariant)
    assert len(program) - 1 not in fixed
    if invariant == set(range(len(arrays))):  # everything but the last one is hoisted
        assert set(fixed) == set(range(len(program) - 1))
    want = fused_cpu.evaluate_blocked(program, arrays, out_shape, block_elements=row)
    got = fused_cpu._run_blocked(program, [np.asarray(a) for a in arrays], out_shape, row,
                                 fixed=fixed)
    np.testing.assert_array_equal(np.broadcast_to(got, out_shape), want)


def test_a_reduction_computes_what_its_blocks_share_once():
    # sqrt of a broadcast variance inside a third moment's prologue: computed once per task.
    x = np.random.default_rng(4).standard_normal((5000, 6)).astype(np.float32)
    mean, var = x.mean(0), x.var(0)
    prologue = (("sub", (("in", 0), ("in", 1)), "float32"),
                ("sqrt", (("in", 2),), "float32"),
                ("div", (("t", 0), ("t", 1)), "float32"),
                ("mul", (("t", 2), ("t", 2)), "float32"))
    fixed = fused_cpu.hoisted(prologue, [x, mean, var], {1, 2})
    assert set(fixed) == {1} and fixed[1].shape == (6,)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tasks, "REDUCE_BLOCK_ELEMENTS", 60)
        got = tasks.reduce_partial("sum", prologue, (0,), "float64", x.shape,
                                   [(), (), ()], x, mean, var)
    z = (x.astype(np.float64) - mean) / np.sqrt(var.astype(np.float64))
    np.testing.assert_allclose(got[0], (z * z).sum(0), rtol=1e-5)


def test_hoisted_values_are_cut_like_inputs_when_a_row_is_longer_than_a_block():
    # A prologue block of rows is cut again by the blocked path when one row passes
    # BLOCK_ELEMENTS: the hoisted per-column values must be cut with it.
    n = fused_cpu.BLOCK_ELEMENTS + 8
    x = np.random.default_rng(6).standard_normal((3, n)).astype(np.float32)
    mean, var = x.mean(0, keepdims=True), x.var(0, keepdims=True) + 1
    prologue = (("sub", (("in", 0), ("in", 1)), "float32"),
                ("sqrt", (("in", 2),), "float32"),
                ("div", (("t", 0), ("t", 1)), "float32"))
    got = tasks.reduce_partial("sum", prologue, (0,), "float64", x.shape, [(), (), ()],
                               x, mean, var)
    want = ((x - mean) / np.sqrt(var)).astype(np.float64).sum(0, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("src", ["bool", "int8", "uint8", "int16", "int32", "int64", "uint32",
                                 "float16", "float32", "float64"])
@pytest.mark.parametrize("dst", ["bool", "int8", "int32", "int64", "float16", "float32",
                                 "float64"])
def test_a_program_that_is_one_cast_matches_astype(src, dst):
    """A final cast is left to numexpr's output casting; its input must still be a type
    numexpr reads (a float16 input failed with KeyError: 'float16' inside the kernel)."""
    low = 0 if src[0] in "ub" else -6  # unsigned and bool sources hold no negatives
    a = (np.arange(low, low + 12).reshape(3, 4) * 1.5).astype(src)
    got = fused_cpu.evaluate((("cast", (("in", 0),), dst),), [a], (3, 4))
    assert got.dtype == np.dtype(dst)
    np.testing.assert_array_equal(got, a.astype(dst))


def test_sign_of_negative_zero_is_positive_zero_on_both_paths():
    """NumPy's sign(-0.0) is +0.0; the numexpr form once kept the operand for zeros."""
    a = np.array([-0.0, 0.0, -2.5, 3.0, np.nan], dtype=np.float32)
    program = (("sign", (("in", 0),), "float32"),)
    for got in (fused_cpu.evaluate_numexpr(program, [a], a.shape),
                fused_cpu.evaluate_blocked(program, [a], a.shape)):
        np.testing.assert_array_equal(got, np.sign(a))
        assert not np.signbit(got[:2]).any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("path", ["numexpr", "blocked"])
def test_maximum_minimum_relu_give_numpys_zero_between_zeros_of_both_signs(dtype, path):
    """Between 0.0 and -0.0 NumPy's maximum and minimum give one operand by a rule of its
    loops (`zero_ties`: on NumPy 2.4 with AVX2 the second, so relu(-0.0) is 0.0); the numexpr
    form once took the first for maximum and minimum and kept -0.0 through relu."""
    a = np.array([0.0, -0.0, 0.0, -0.0, -0.0, np.nan], dtype=dtype)
    b = np.array([0.0, 0.0, -0.0, -0.0, np.nan, -0.0], dtype=dtype)
    run = fused_cpu.evaluate_numexpr if path == "numexpr" else fused_cpu.evaluate_blocked
    cases = [("maximum", [a, b], np.maximum(a, b)), ("minimum", [a, b], np.minimum(a, b)),
             ("maximum", [b, a], np.maximum(b, a)), ("minimum", [b, a], np.minimum(b, a)),
             ("relu", [a], np.maximum(a, np.zeros((), dtype)))]
    for op, arrays, want in cases:
        program = ((op, tuple(("in", i) for i in range(len(arrays))), dtype),)
        got = run(program, arrays, a.shape)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=op)
