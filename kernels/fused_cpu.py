"""One-pass evaluation of fused elementwise programs on the CPU.

A fused program (`deepx_flow.ir.program`) is a chain of elementwise instructions. Evaluating it
one NumPy call per instruction would write and read one full-size temporary per instruction;
here the whole program runs in one pass over memory, with temporaries that stay in cache. There
are two paths, and both give NumPy's results and dtypes instruction by instruction:

- numexpr path. The program becomes one numexpr expression (built once per program and input
  dtypes, cached). numexpr walks the operands in blocks of 1024 elements and keeps its
  temporaries in per-block registers. Constants are passed as typed 0-d arrays, never as
  literals: numexpr reads a Python float literal as float64, which would turn float32 programs
  into float64 ones. Only dtypes numexpr computes exactly as NumPy does are used (bool, int32,
  int64, float32, float64); every instruction is lowered with explicit conversions to the dtype
  NumPy's own loop would use, and the compiled result kind is checked against the program's.
  A final `cast` is left to numexpr's output casting, so a float64 program may end in float16.
- Blocked path. It walks the output in blocks of `BLOCK_ELEMENTS` elements along the flattened
  leading axes and runs the reference operators (`elementwise.apply_op`) on block buffers that
  are allocated once per call and reused for every block; a register allocator frees a
  temporary's buffer after its last use. It runs every program, including those numexpr
  cannot run exactly: float16, int8/16, unsigned ints, narrowing casts, integer pow, and
  programs too large for one expression.

Which path: numexpr is not the faster one for most programs here. NumPy 2's SIMD loops, run on
cache-resident blocks, beat numexpr's scalar libm calls on float32 exp/log/tanh (tanh 4 ns per
element against 17, gelu 5 against 25) and on maximum; numexpr wins on where() and float64 exp.
A 10-instruction float32 chain over 4M elements took 208 ms through numexpr, 70 ms unfused
(one NumPy call and temporary per instruction) and 40 to 47 ms blocked (11 ms with the
256K-element blocks chosen below). So `evaluate` takes numexpr only where it can run the
program exactly and the measured per-instruction costs (`OP_COST_NS`) predict it faster.
With a VML-enabled numexpr, or other hardware, re-measure (`benchmarks/bench_fused_kernel.py --ops`).

Both paths compute at the broadcast shape of the inputs the program reads and only then widen
the result to the task's output shape, so a program that reads a small bias costs the bias'
size, not the output's.

numexpr threads under Dask (measured on the 2-core development machine, numexpr 2.14.2,
float32 arrays of 4M elements, a 9-operation expression; `benchmarks/bench_fused_kernel.py`;
the machine was shared, so throughput numbers varied by about 30% between runs):

- With more than one numexpr thread, every evaluation takes a process-wide mutex
  (`gs.parallel_mutex` in numexpr's interpreter.cpp) for its whole run, so concurrent calls
  from Dask's worker threads serialize. With 2 numexpr threads one call took 87 ms, 2
  concurrent calls 175 ms (2.00x) and 4 concurrent calls 359 ms (4.11x); an 8192-element call
  issued while a 32M-element call ran waited for it: 0.3 to 2.2 s in five runs.
- With one numexpr thread, numexpr runs serially with the GIL released and takes no global
  lock: one call took 153 ms, 2 concurrent calls 251 ms (1.64x) and 4 concurrent calls 363 ms,
  the same throughput as 2 threads once every Dask thread is busy; the 8192-element call
  returned in 0.4 to 0.6 ms whatever else ran.
- A Dask worker already runs one task per thread, so extra numexpr threads add no throughput
  when the worker is busy; they oversubscribe the cores and queue small tasks behind large
  ones.

Decision: numexpr runs with `NUMEXPR_THREADS` = 1 thread. numexpr's thread count is a
process-wide setting, so this module sets it once, before its first numexpr compile
(distributed's nanny already starts workers with OMP_NUM_THREADS=1, which numexpr also reads).
A compiled numexpr program keeps its register pointers in the program object, so one object
must not run in two threads at once: compiled programs are cached per thread.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from deepx_flow.errors import ExecutionError
from deepx_flow.ir.program import Program
from deepx_flow.kernels.elementwise import COMPARISONS, GELU_C, GELU_K, OPS, apply_op, constant

try:
    import numexpr as ne
except ImportError:  # numexpr is a dependency, but the blocked path needs nothing beyond NumPy
    ne = None

# Elements per block of the blocked path: 256K elements is 1/2 MiB per float32/float64
# buffer, so a chain's few live buffers stay in L2/L3. On the 10-operation chain of
# benchmarks/bench_elementwise.py (4M float32 elements, 2-core EPYC) blocks of 64K, 128K,
# 256K, 512K and 1M elements took 16.4, 13.2, 11.0, 13.3 and 15.1 ms (unfused NumPy: 24 ms);
# small blocks pay NumPy's per-call overhead once per instruction per block, large ones
# spill out of cache.
BLOCK_ELEMENTS = 1 << 18
# numexpr threads per call; see the module docstring for the measurements behind 1.
NUMEXPR_THREADS = 1
# Limits of the numexpr path. Shared temporaries are written out once per use in the
# expression (numexpr merges the copies again), so a program that reuses values a lot can
# grow; past these limits the blocked path is cheaper to set up and safe from Python's parser
# nesting limit (200) and NumPy's iterator operand limit (32 with NumPy 1.x).
MAX_EXPR_CHARS = 20_000
MAX_EXPR_DEPTH = 120
MAX_NUMEXPR_OPERANDS = 31

# Nanoseconds per element and instruction, measured with benchmarks/bench_fused_kernel.py
# (--ops) on the development machine (AMD EPYC, AVX2, no AVX-512; NumPy 2.4.6; numexpr 2.14.2
# without VML), rounded: (numexpr 4-byte, numexpr 8-byte, blocked 4-byte, blocked 8-byte).
# NumPy's SIMD loops make its float32 transcendentals several times faster than the scalar
# libm calls numexpr makes, and NumPy's maximum is one instruction where numexpr needs a
# NaN-aware where(); numexpr wins on where() and float64 exp. Re-measure on new hardware.
OP_COST_NS: dict[str, tuple[float, float, float, float]] = {
    "neg": (0.4, 0.5, 0.4, 0.5), "add": (0.5, 0.8, 0.5, 0.85),
    "sub": (0.5, 0.8, 0.5, 0.85), "mul": (0.5, 0.75, 0.5, 0.8),
    "div": (1.0, 1.4, 0.6, 0.9), "pow": (9.0, 18.0, 8.0, 15.0),
    "maximum": (6.0, 5.0, 0.6, 0.9), "minimum": (6.0, 5.0, 0.6, 0.9),
    "where": (1.7, 1.5, 4.0, 4.5), "abs": (2.0, 2.3, 0.7, 0.7),
    "exp": (3.2, 7.0, 1.7, 10.0), "log": (5.0, 8.0, 2.5, 7.5),
    "sqrt": (1.6, 2.8, 0.6, 1.7), "tanh": (17.0, 16.0, 4.0, 17.0),
    "sigmoid": (4.5, 9.5, 2.2, 10.0), "gelu": (25.0, 30.0, 5.0, 19.0),
    "relu": (1.5, 1.4, 0.8, 0.8), "cast": (0.5, 0.7, 0.5, 0.8),
    "lt": (0.8, 1.0, 0.6, 0.9), "le": (0.8, 1.0, 0.6, 0.9), "gt": (0.8, 1.0, 0.6, 0.9),
    "ge": (0.8, 1.0, 0.6, 0.9), "eq": (0.8, 1.0, 0.6, 0.9), "ne": (0.8, 1.0, 0.6, 0.9),
}
_INT_MAXMIN_COST_NS = (3.0, 2.6, 0.7, 0.9)

# dtype -> (numexpr signature type, numexpr result kind code)
_NE_TYPES: dict[str, tuple[type, bytes]] = {
    "bool": (bool, b"b"), "int32": (np.int32, b"i"), "int64": (np.int64, b"l"),
    "float32": (float, b"f"), "float64": (np.float64, b"d"),
}
# Conversions numexpr does exactly like NumPy's astype; done as `x * one` so that -0.0, NaN and
# infinities pass through unchanged (`x + 0` would turn -0.0 into 0.0).
_WIDEN = {("int32", "int64"), ("int32", "float32"), ("int32", "float64"),
          ("int64", "float32"), ("int64", "float64"), ("float32", "float64")}
_INT = ("int32", "int64")
_FLOAT = ("float32", "float64")
_NE_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_NE_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}


def evaluate(program: Program, arrays: Sequence[np.ndarray], out_shape: tuple[int, ...]
             ) -> np.ndarray:
    """Evaluate a fused elementwise program on NumPy arrays in one pass over memory.

    Takes the numexpr path when numexpr can run the program exactly and the cost table
    predicts it faster, else the blocked path (see the module docstring).

    Parameters
    ----------
    program
        A fused program (see `deepx_flow.ir.program`).
    arrays
        The task's input arrays; `("in", k)` reads `arrays[k]`. They broadcast as in NumPy.
    out_shape
        The task's output shape; the inputs must broadcast to it.

    Returns
    -------
    numpy.ndarray
        A new, writable, C-contiguous array of shape `out_shape` and the dtype of the program's
        last instruction.

    Raises
    ------
    ExecutionError
        For an empty program, missing inputs, inputs that do not broadcast to `out_shape`, or an
        unknown operator.
    """
    arrays, shape = _prepare(program, arrays, out_shape)
    if math.prod(shape) == 0:
        return np.empty(out_shape, dtype=program[-1][2])
    src = _choice(program, tuple(a.dtype.name for a in arrays))
    compiled = _compiled(src) if src is not None else None
    if compiled is not None:
        result = _run_numexpr(src, compiled, arrays, shape)
    else:
        result = _run_blocked(program, arrays, shape, BLOCK_ELEMENTS)
    return _widen(result, out_shape)


def evaluate_numexpr(program: Program, arrays: Sequence[np.ndarray],
                     out_shape: tuple[int, ...]) -> np.ndarray:
    """Like `evaluate`, but only through numexpr; raises ExecutionError where it cannot."""
    arrays, shape = _prepare(program, arrays, out_shape)
    src = numexpr_source(program, tuple(a.dtype.name for a in arrays))
    compiled = _compiled(src) if src is not None else None
    if compiled is None:
        raise ExecutionError("this fused program cannot run exactly through numexpr "
                             f"(input dtypes {[a.dtype.name for a in arrays]}); use evaluate")
    if math.prod(shape) == 0:
        return np.empty(out_shape, dtype=program[-1][2])
    return _widen(_run_numexpr(src, compiled, arrays, shape), out_shape)


def evaluate_blocked(program: Program, arrays: Sequence[np.ndarray],
                     out_shape: tuple[int, ...], block_elements: int = BLOCK_ELEMENTS
                     ) -> np.ndarray:
    """Like `evaluate`, but always through the blocked NumPy evaluator.

    Parameters
    ----------
    block_elements
        The most elements one block holds (see `iter_blocks`).
    """
    arrays, shape = _prepare(program, arrays, out_shape)
    if math.prod(shape) == 0:
        return np.empty(out_shape, dtype=program[-1][2])
    return _widen(_run_blocked(program, arrays, shape, block_elements), out_shape)


def engine_for(program: Program, in_dtypes: Sequence[str]) -> str:
    """Which path `evaluate` takes for this program and input dtypes: "numexpr" or "blocked"."""
    src = _choice(program, tuple(in_dtypes))
    return "numexpr" if src is not None and _compiled(src) is not None else "blocked"


def estimated_cost(program: Program) -> dict[str, float]:
    """Estimated nanoseconds per output element of each path, from `OP_COST_NS`.

    Returns
    -------
    dict
        `{"numexpr": ns, "blocked": ns}`.
    """
    ne_ns = np_ns = 0.0
    for op, _, dtype in program:
        col = 0 if np.dtype(dtype).itemsize <= 4 else 1
        if op in ("maximum", "minimum") and np.dtype(dtype).kind in "iu":
            costs = _INT_MAXMIN_COST_NS
        else:
            costs = OP_COST_NS.get(op, (1.0, 1.0, 1.0, 1.0))
        ne_ns += costs[col]
        np_ns += costs[2 + col]
    return {"numexpr": ne_ns, "blocked": np_ns}


def _prepare(program: Program, arrays, out_shape) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """Check the call and return the arrays and the broadcast shape of the inputs read."""
    arrays = [np.asarray(a) for a in arrays]
    _, shape = check_call(program, [a.shape for a in arrays], out_shape)
    return arrays, shape


def check_call(program: Program, shapes, out_shape) -> tuple[list[int], tuple[int, ...]]:
    """Check a fused call against its input shapes, for every engine.

    Returns the input indices the program reads and the broadcast shape of those inputs;
    raises ExecutionError for an empty program, a missing input, or inputs that do not
    broadcast to `out_shape`.
    """
    if not program:
        raise ExecutionError("cannot evaluate an empty fused program")
    used = sorted({a[1] for _, args, _ in program for a in args if a[0] == "in"})
    if used and used[-1] >= len(shapes):
        raise ExecutionError(f"fused program reads input {used[-1]} but the task has "
                             f"{len(shapes)} input array(s)")
    out_shape = tuple(int(s) for s in out_shape)
    read = [tuple(shapes[k]) for k in used]
    try:
        shape = tuple(np.broadcast_shapes(*read)) if read else ()
        if np.broadcast_shapes(shape, out_shape) != out_shape:
            raise ValueError
    except ValueError:
        raise ExecutionError(f"fused program inputs of shapes {read} do not broadcast to the "
                             f"output shape {out_shape}") from None
    return used, shape


def _widen(result: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    if result.shape == tuple(out_shape):
        return result
    out = np.empty(out_shape, dtype=result.dtype)
    out[...] = result
    return out


# ---------------------------------------------------------------------------------------------
# numexpr path

@dataclass(frozen=True)
class NumexprSource:
    """A program lowered to one numexpr expression.

    `operands` lists, in signature order, where each variable comes from: `("in", k)` for the
    k-th input array, or `("c", array)` for a typed 0-d constant.
    """

    expression: str
    signature: tuple[tuple[str, type], ...]
    operands: tuple[tuple, ...]
    result_dtype: str  # what the expression computes
    out_dtype: str     # the program's dtype (differs when a final cast is left to numexpr)

    @property
    def key(self) -> tuple:
        return (self.expression, tuple((n, t.__name__) for n, t in self.signature))


_CHOICES: dict[tuple[str, tuple[str, ...]], NumexprSource | None] = {}
_CACHE_MAX = 4096
_local = threading.local()
_threads_lock = threading.Lock()
_threads_set = False


def numexpr_source(program: Program, in_dtypes: tuple[str, ...]) -> NumexprSource | None:
    """Lower a program to one numexpr expression, or None where numexpr cannot run it exactly.

    A pure function of the program and the dtypes of the task's input arrays.
    """
    if ne is None:
        return None
    return _Lowering(tuple(in_dtypes)).lower(program)


def _choice(program: Program, in_dtypes: tuple[str, ...]) -> NumexprSource | None:
    """The numexpr source to run, or None for the blocked path; cached per program and dtypes.

    The cache key is the program's repr, which (unlike tuple equality) tells 0.0 from -0.0 and
    matches NaN constants.
    """
    key = (repr(program), in_dtypes)
    try:
        return _CHOICES[key]
    except KeyError:
        pass
    src = numexpr_source(program, in_dtypes)
    if src is not None:
        cost = estimated_cost(program)
        if cost["numexpr"] >= cost["blocked"]:
            src = None
    if len(_CHOICES) >= _CACHE_MAX:
        _CHOICES.clear()  # a crude bound; a process sees few distinct programs in practice
    _CHOICES[key] = src
    return src


def _set_numexpr_threads() -> None:
    """Set numexpr's process-wide thread count once (see the module docstring)."""
    global _threads_set
    if _threads_set:
        return
    with _threads_lock:
        if not _threads_set:
            if ne.get_num_threads() != NUMEXPR_THREADS:
                ne.set_num_threads(NUMEXPR_THREADS)
            _threads_set = True


def _compiled(src: NumexprSource):
    """This thread's compiled numexpr program for `src`, or None if numexpr rejects it."""
    cache = getattr(_local, "compiled", None)
    if cache is None:
        cache = _local.compiled = {}
    key = src.key
    nex = cache.get(key)
    if nex is None:
        _set_numexpr_threads()
        try:
            nex = ne.NumExpr(src.expression, signature=list(src.signature))
            # The result kind must be the program's; anything else is a lowering gap.
            if nex.fullsig[:1] != _NE_TYPES[src.result_dtype][1]:
                nex = False
        except Exception:  # an opcode numexpr lacks: the blocked path is always available
            nex = False
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[key] = nex
    return nex or None


def _run_numexpr(src: NumexprSource, nex, arrays: list[np.ndarray], shape) -> np.ndarray:
    out = np.empty(shape, dtype=src.out_dtype)
    args = [arrays[o[1]] if o[0] == "in" else o[1] for o in src.operands]
    # ex_uses_vml only asks for contiguous, aligned buffers: always safe to pass when VML is on.
    nex(*args, out=out, order="K", casting="unsafe", ex_uses_vml=bool(ne.use_vml))
    return out


class _Lowering:
    """Turns a program into one numexpr expression; `lower` returns None when it cannot."""

    def __init__(self, in_dtypes: tuple[str, ...]):
        self.in_dtypes = in_dtypes
        self.constants: dict[tuple[str, str], str] = {}  # (repr(value), dtype) -> name
        self.values: dict[str, np.ndarray] = {}

    def lower(self, program: Program) -> NumexprSource | None:
        # A final cast is left to numexpr's output casting (NumPy's astype rules), so programs
        # may end in any dtype, float16 and int8 included.
        body = program[:-1] if program[-1][0] == "cast" and len(program[-1][1]) == 1 \
            else program
        exprs: list[tuple[str, str]] = []
        for op, args, dtype in body:
            operands = [self.ref(a, exprs) for a in args]
            if any(o is None for o in operands) or dtype not in _NE_TYPES:
                return None
            e = self.instruction(op, operands, dtype)
            if e is None:
                return None
            exprs.append((e, dtype))
        if body is program:
            expression, result = exprs[-1]
        else:
            final = self.ref(program[-1][1][0], exprs)
            if final is None:
                return None
            expression, result = final
        return self.finish(expression, result, program[-1][2])

    def finish(self, expression: str, result: str, out_dtype: str) -> NumexprSource | None:
        if len(expression) > MAX_EXPR_CHARS or _depth(expression) > MAX_EXPR_DEPTH:
            return None
        names = sorted(set(re.findall(r"\b[xk]\d+\b", expression)),
                       key=lambda n: (n[0], int(n[1:])))
        if len(names) > MAX_NUMEXPR_OPERANDS:
            return None
        signature, operands = [], []
        for n in names:
            if n[0] == "x":
                k = int(n[1:])
                signature.append((n, _NE_TYPES[self.in_dtypes[k]][0]))
                operands.append(("in", k))
            else:
                value = self.values[n]
                signature.append((n, _NE_TYPES[value.dtype.name][0]))
                operands.append(("c", value))
        return NumexprSource(expression, tuple(signature), tuple(operands), result, out_dtype)

    def ref(self, arg, exprs) -> tuple[str, str] | None:
        if arg[0] == "in":
            dtype = self.in_dtypes[arg[1]]
            return (f"x{arg[1]}", dtype) if dtype in _NE_TYPES else None
        if arg[0] == "t":
            return exprs[arg[1]]
        if arg[0] == "c":
            return (self.const(arg[1], arg[2]), arg[2]) if arg[2] in _NE_TYPES else None
        raise ExecutionError(f"bad fused-program argument {arg!r}; expected ('in', k), "
                             "('t', j) or ('c', value, dtype)")

    def const(self, value, dtype: str) -> str:
        key = (repr(value), dtype)
        name = self.constants.get(key)
        if name is None:
            name = self.constants[key] = f"k{len(self.constants)}"
            array = constant(value, dtype)
            array.flags.writeable = False  # shared by every call of the cached program
            self.values[name] = array
        return name

    def conv(self, operand: tuple[str, str], dst: str) -> str | None:
        """`operand` converted exactly (as NumPy's astype would) to `dst`, or None."""
        e, src = operand
        if src == dst:
            return e
        if dst == "bool":
            return f"({e} != {self.const(0, src)})"
        if src == "bool":  # numexpr has no bool-to-number casts except to int32
            return f"where({e}, {self.const(1, dst)}, {self.const(0, dst)})"
        if (src, dst) in _WIDEN:
            return f"({e} * {self.const(1, dst)})"
        return None  # narrowing (float64 -> float32, float -> int): only NumPy does it exactly

    def instruction(self, op: str, operands: list[tuple[str, str]], r: str) -> str | None:
        if op not in OPS:
            raise ExecutionError(f"unknown elementwise operator {op!r} in a fused program")
        if op == "cast":
            return self.conv(operands[0], r)
        if op in COMPARISONS:
            # NumPy compares in the promoted dtype of the operands.
            c = np.result_type(operands[0][1], operands[1][1]).name
            if c not in _NE_TYPES:
                return None
            a, b = (self.conv(o, c) for o in operands)
            return None if a is None or b is None else f"({a} {_NE_COMPARE[op]} {b})"
        if op == "where":
            cond = operands[0]
            a, b = (self.conv(o, r) for o in operands[1:])
            if cond[1] != "bool" or a is None or b is None:
                return None
            return f"where({cond[0]}, {a}, {b})"
        # Every other operator computes in its result dtype, as NumPy's loop does.
        xs = [self.conv(o, r) for o in operands]
        if any(x is None for x in xs):
            return None
        return self.compute(op, xs, r)

    def compute(self, op: str, xs: list[str], r: str) -> str | None:
        a = xs[0]
        b = xs[1] if len(xs) > 1 else None
        k = self.const
        if r == "bool":
            # NumPy's bool loops: add is or, mul is and, maximum is or, minimum is and.
            table = {"abs": a, "add": f"({a} | {b})", "mul": f"({a} & {b})",
                     "maximum": f"({a} | {b})", "minimum": f"({a} & {b})"}
            return table.get(op)
        if op in ("exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "div", "pow") \
                and r not in _FLOAT:
            return None  # integer pow (NumPy raises for negative exponents) goes blocked
        if op == "neg":
            return f"(-{a})"
        if op == "abs":
            # numexpr's abs turns integers into float64; spell it out for them.
            return f"abs({a})" if r in _FLOAT else f"where({a} < {k(0, r)}, -{a}, {a})"
        if op in ("exp", "log", "sqrt", "tanh"):
            return f"{op}({a})"
        if op == "sigmoid":
            return f"({k(1, r)} / ({k(1, r)} + exp(-{a})))"
        if op == "gelu":
            inner = f"(({a} + {k(GELU_C, r)} * ({a} * {a} * {a})) * {k(GELU_K, r)})"
            return f"(((tanh({inner}) + {k(1, r)}) * {a}) * {k(0.5, r)})"
        if op == "relu":
            return f"where({a} < {k(0, r)}, {k(0, r)}, {a})"  # NaN < 0 is False: NaN stays
        if op in _NE_ARITH:
            return f"({a} {_NE_ARITH[op]} {b})"
        if op in ("maximum", "minimum"):
            cmp = ">=" if op == "maximum" else "<="
            if r in _INT:
                return f"where({a} {cmp} {b}, {a}, {b})"
            # numexpr's own maximum/minimum propagate NaN but compute float32 in float64, so
            # spell out NumPy's rule: take a when it wins or is NaN, else b (NaN or not).
            return f"where(({a} {cmp} {b}) | ({a} != {a}), {a}, {b})"
        return None


def _depth(expression: str) -> int:
    depth = deepest = 0
    for ch in expression:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


# ---------------------------------------------------------------------------------------------
# Blocked path

def iter_blocks(shape: tuple[int, ...], max_elements: int) -> Iterator[Any]:
    """Index keys that cut an array of `shape` into C-contiguous blocks of <= max_elements.

    The blocks run along the flattened leading axes: trailing axes are kept whole while they
    fit, the next axis is sliced, and the axes before it are taken one index at a time. If the
    last axis alone is longer than `max_elements`, it is sliced. Indexing with a key gives a
    view (a 0-d array gives the single key `...`).

    Parameters
    ----------
    shape
        The array's shape.
    max_elements
        The most elements in one block (at least 1).
    """
    shape = tuple(int(s) for s in shape)
    max_elements = max(1, int(max_elements))
    if not shape:
        yield ...
        return
    if math.prod(shape) == 0:
        return
    k = len(shape) - 1
    inner = 1  # elements in one index of axis k (the product of the axes after it)
    while k > 0 and inner * shape[k] <= max_elements:
        inner *= shape[k]
        k -= 1
    step = max(1, max_elements // inner)
    for outer in np.ndindex(*shape[:k]):
        for start in range(0, shape[k], step):
            yield outer + (slice(start, min(start + step, shape[k])),)


def _run_blocked(program: Program, arrays: list[np.ndarray], shape, block_elements: int
                 ) -> np.ndarray:
    n = len(program)
    out = np.empty(shape, dtype=program[-1][2])
    views = {k: np.broadcast_to(arrays[k], shape)
             for k in {a[1] for _, args, _ in program for a in args if a[0] == "in"}}
    consts = {(j, i): constant(a[1], a[2])
              for j, (_, args, _) in enumerate(program) for i, a in enumerate(args)
              if a[0] == "c"}
    slots, slot_dtypes, scratch = _allocate(program)
    block = max(1, min(int(block_elements), math.prod(shape)))
    buffers = [np.empty(block, dtype=d) for d in slot_dtypes]
    # float16 sigmoid/gelu compute in float32: give them a reused float32 buffer instead of
    # letting apply_op allocate one per block.
    f32 = np.empty(block, dtype=np.float32) if scratch else None

    with np.errstate(all="ignore"):
        for key in iter_blocks(shape, block):
            target = out[key]
            bshape, m = target.shape, target.size
            values: list[Any] = [None] * n
            for j, (op, args, dtype) in enumerate(program):
                operands = [views[a[1]][key] if a[0] == "in" else values[a[1]] if a[0] == "t"
                            else consts[(j, i)] for i, a in enumerate(args)]
                dest = target if j == n - 1 else buffers[slots[j]][:m].reshape(bshape)
                if dtype == "float16" and op in ("sigmoid", "gelu"):
                    work = f32[:m].reshape(bshape)
                    apply_op(op, operands, "float32", np, out=work)
                    np.copyto(dest, work, casting="unsafe")
                else:
                    apply_op(op, operands, dtype, np, out=dest)
                values[j] = dest
    return out


def _allocate(program: Program) -> tuple[dict[int, int], list[str], bool]:
    """Give each temporary a block buffer, reusing buffers of dead temporaries of its dtype.

    Returns the buffer of each instruction (the last writes the output), the dtype of each
    buffer, and whether a float32 scratch buffer is needed. An instruction never writes into a
    buffer one of its own operands lives in.
    """
    n = len(program)
    last_use = [-1] * n
    for j, (_, args, _) in enumerate(program):
        for a in args:
            if a[0] == "t":
                if not 0 <= a[1] < j:
                    raise ExecutionError(f"fused program instruction {j} reads temporary "
                                         f"{a[1]}, which is not computed before it")
                last_use[a[1]] = j
    slots: dict[int, int] = {}
    slot_dtypes: list[str] = []
    free: dict[str, list[int]] = {}
    scratch = False
    for j, (op, args, dtype) in enumerate(program):
        scratch |= dtype == "float16" and op in ("sigmoid", "gelu")
        if j < n - 1:
            pool = free.setdefault(dtype, [])
            if pool:
                slots[j] = pool.pop()
            else:
                slots[j] = len(slot_dtypes)
                slot_dtypes.append(dtype)
        for a in args:
            if a[0] == "t" and last_use[a[1]] == j and a[1] in slots:
                if slots[a[1]] not in free[program[a[1]][2]]:  # read twice by instruction j
                    free[program[a[1]][2]].append(slots[a[1]])
        if j < n - 1 and last_use[j] == -1:  # computed but never read: free at once
            free[dtype].append(slots[j])
    return slots, slot_dtypes, scratch
