"""One-pass evaluation of fused elementwise programs on the CPU.

A fused program (`deepx_flow.ir.program`) is a chain of elementwise instructions. Evaluating it
one NumPy call per instruction would write and read one full-size temporary per instruction;
here the whole program runs in one pass over memory, with temporaries that stay in cache. There
are two paths, and both give NumPy's results and dtypes instruction by instruction:

- numexpr path. `fused_numexpr` lowers the program to numexpr code (once per program and
  input dtypes, cached), exactly as NumPy computes it, in code that grows linearly with the
  program. A short chain is one expression, run in one numexpr call over the task: numexpr
  walks the operands in blocks of 1024 elements and keeps its temporaries in per-block
  registers. A long program, or one that reads a long value several times, is several
  expressions (stages), each reading earlier stages' results by name; they run block by block
  like the blocked path, the stages' results in reused block buffers. numexpr refusing the
  generated code is a `CodegenError` (a code-generation failure, never taken for running out
  of memory), except an operation numexpr has no kernel for, which goes to the blocked path.
- Blocked path. It walks the output in blocks of `BLOCK_ELEMENTS` elements along the flattened
  leading axes and runs the reference operators (`elementwise.apply_op`) on block buffers that
  are allocated once per call and reused for every block; a register allocator frees a
  temporary's buffer after its last use. It runs every program, including those numexpr
  cannot run exactly: float16, bfloat16, int8/16, unsigned ints, narrowing casts and integer
  pow.

Which path: numexpr is not the faster one for most programs here. NumPy 2's SIMD loops, run on
cache-resident blocks, beat numexpr's scalar libm calls on float32 exp/log/tanh (tanh 4 ns per
element against 17, gelu 5 against 25), on maximum and on float32 where() (a select without
branches, `elementwise._select`); numexpr wins on float64 where() and exp.
A 10-instruction float32 chain over 4M elements took 208 ms through numexpr, 70 ms unfused
(one NumPy call and temporary per instruction) and 40 to 47 ms blocked (11 ms with the
256K-element blocks chosen below). So `evaluate` takes numexpr only where the measured
per-instruction costs (`OP_COST_NS`) predict it faster (read before anything is lowered) and
it can run the program exactly. With a VML-enabled numexpr, or other hardware, re-measure
(`benchmarks/bench_fused_kernel.py --ops`).

Both paths compute at the broadcast shape of the inputs the program reads and only then widen
the result to the task's output shape, so a program that reads a small bias costs the bias'
size, not the output's.

A program with whole-axis instructions (softmax, log_softmax; see `ir.program`) takes the
blocked path, computes at the output shape (a softmax normalizes over the whole axis), and
its blocks keep that axis and every axis after it whole. Its softmax and log_softmax of one
value along one axis share one `kernels.softmax.normalize` per block, in buffers of their own.

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
import threading
from typing import Any, Iterator, Sequence

import numpy as np

from deepx_flow.errors import CodegenError, ExecutionError
from deepx_flow.ir.dtypes import accumulator
from deepx_flow.ir.program import WHOLE_AXIS_OPS, Program, whole_axes
from deepx_flow.kernels import fused_numexpr, recycled, softmax
from deepx_flow.kernels.elementwise import apply_op, constant
from deepx_flow.kernels.fused_numexpr import NumexprSource

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

# Nanoseconds per element and instruction, measured with benchmarks/bench_fused_kernel.py
# (--ops) on the development machine (AMD EPYC, AVX2, no AVX-512; NumPy 2.4.6; numexpr 2.14.2
# without VML), rounded: (numexpr 4-byte, numexpr 8-byte, blocked 4-byte, blocked 8-byte).
# NumPy's SIMD loops make its float32 transcendentals several times faster than the scalar
# libm calls numexpr makes, and NumPy's maximum is one instruction where numexpr needs a
# NaN-aware where(); numexpr wins on float64 where() and exp. Re-measure on new hardware.
# where: blocked re-measured after it became a branch-free select (was 4.0 and 4.5).
OP_COST_NS: dict[str, tuple[float, float, float, float]] = {
    "neg": (0.4, 0.5, 0.4, 0.5), "add": (0.5, 0.8, 0.5, 0.85),
    "sub": (0.5, 0.8, 0.5, 0.85), "mul": (0.5, 0.75, 0.5, 0.8),
    "div": (1.0, 1.4, 0.6, 0.9), "pow": (9.0, 18.0, 8.0, 15.0),
    "maximum": (6.0, 5.0, 0.6, 0.9), "minimum": (6.0, 5.0, 0.6, 0.9),
    "where": (1.7, 1.5, 0.7, 1.4), "abs": (2.0, 2.3, 0.7, 0.7),
    "exp": (3.2, 7.0, 1.7, 10.0), "log": (5.0, 8.0, 2.5, 7.5),
    "sqrt": (1.6, 2.8, 0.6, 1.7), "tanh": (17.0, 16.0, 4.0, 17.0),
    "sigmoid": (4.5, 9.5, 2.2, 10.0), "gelu": (25.0, 30.0, 5.0, 19.0),
    "erf": (math.inf, math.inf, 6.0, 12.0),  # numexpr has no erf: always blocked
    # Measured with AVX-512 NumPy loops (2026-11-25): NumPy's float32 sin, cos and tan are
    # SIMD, its float64 sin and cos call libm (numexpr's float64 cos is faster).
    "sin": (10.6, 20.2, 0.4, 19.8), "cos": (6.5, 11.1, 0.4, 31.7),
    "tan": (34.3, 14.4, 0.3, 0.9), "floor": (1.2, 1.2, 0.15, 0.2),
    "ceil": (1.6, 1.2, 0.15, 0.2), "sign": (7.6, 7.9, 0.35, 0.5),
    "round": (math.inf, math.inf, 0.15, 0.2),  # numexpr's round is not rint: always blocked
    "reciprocal": (0.3, 0.55, 0.2, 0.45), "softplus": (13.7, 15.1, 15.2, 16.3),
    # Measured 2026-11-29 with a CPU-bound process on the other core (bench_fused_kernel.py
    # --ops, one instruction on operands in the domain): both paths call libm's scalar loops.
    "sinh": (29.0, 32.0, 26.0, 32.0), "cosh": (11.0, 14.0, 11.0, 14.0),
    "asinh": (26.0, 30.0, 27.0, 30.0), "acosh": (17.0, 16.0, 18.0, 17.0),
    "atanh": (29.0, 29.0, 25.0, 30.0),
    "relu": (1.5, 1.4, 0.8, 0.8), "cast": (0.5, 0.7, 0.5, 0.8),
    "lt": (0.8, 1.0, 0.6, 0.9), "le": (0.8, 1.0, 0.6, 0.9), "gt": (0.8, 1.0, 0.6, 0.9),
    "ge": (0.8, 1.0, 0.6, 0.9), "eq": (0.8, 1.0, 0.6, 0.9), "ne": (0.8, 1.0, 0.6, 0.9),
}
_INT_MAXMIN_COST_NS = (3.0, 2.6, 0.7, 0.9)


def evaluate(program: Program, arrays: Sequence[np.ndarray], out_shape: tuple[int, ...],
             out: np.ndarray | None = None, fixed: dict | None = None,
             scratch: dict | None = None) -> np.ndarray:
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
    out
        Where to write the result, if given: a C-contiguous array of `out_shape` and the
        result's dtype, which may be one of `arrays` (a matmul's epilogue overwrites its
        product: each block is read before it is written). Ignored where it does not fit.
    fixed
        Instruction index -> its value, computed once already (`hoisted`): a caller that
        evaluates a program block by block computes what every block shares only once. The
        blocked path uses them; numexpr computes everything.
    scratch
        Where a small program (`SMALL_ELEMENTS`) keeps its temporaries for the next call of
        the same shapes: on a Dask worker, which hands freed memory back to the kernel at
        once, new ones fault their pages in again every call (a batch chain's bias and
        activation took twice as long).

    Returns
    -------
    numpy.ndarray
        `out`, or a new, writable, C-contiguous array of shape `out_shape` and the dtype of the
        program's last instruction.

    Raises
    ------
    ExecutionError
        For an empty program, missing inputs, inputs that do not broadcast to `out_shape`, or an
        unknown operator; its subclass CodegenError when generating or compiling the numexpr
        code fails.
    """
    arrays, shape = _prepare(program, arrays, out_shape)
    if math.prod(shape) == 0:
        return np.empty(out_shape, dtype=program[-1][2])
    if out is not None and not (out.shape == shape == tuple(out_shape) and
                                out.dtype == program[-1][2] and out.flags.c_contiguous
                                and out.flags.writeable):
        out = None
    src = None if whole_axes(program) else _choice(program, tuple(a.dtype.name for a in arrays))
    compiled = _compiled(src, program) if src is not None else None
    if compiled is not None:
        result = _run_numexpr(src, compiled, arrays, shape, BLOCK_ELEMENTS, out)
    elif math.prod(shape) <= SMALL_ELEMENTS and not fixed and not whole_axes(program):
        result = _run_small(program, arrays, shape, out, scratch)
    else:
        result = _run_blocked(program, arrays, shape, BLOCK_ELEMENTS, out, fixed)
    return _widen(result, out_shape)


# Up to this many elements a program runs as one block with plain NumPy temporaries: a
# batch chain (`kernels/batch_chain.py`) evaluates a bias and activation on a few dozen
# images' activations hundreds of times a task, where `_run_blocked`'s set-up (views,
# block buffers, the block loop) cost twice the arithmetic (67 us against 30 us a call).
SMALL_ELEMENTS = 1 << 16


def _run_small(program: Program, arrays: list[np.ndarray], shape, out, scratch=None
               ) -> np.ndarray:
    """The program on arrays of at most SMALL_ELEMENTS results, instruction by instruction
    (what `_run_blocked` does for one block); temporaries kept in `scratch` if given."""
    values: list[Any] = []
    last = len(program) - 1
    with np.errstate(all="ignore"):
        for j, (op, args, dtype) in enumerate(program):
            operands = [arrays[a[1]] if a[0] == "in" else values[a[1]] if a[0] == "t"
                        else constant(a[1], a[2]) for a in args]
            dest_shape = shape if j == last else np.broadcast_shapes(
                *[np.shape(o) for o in operands])
            if j == last and out is not None:
                dest = out
            elif scratch is None or j == last:  # the result is the caller's to keep
                dest = np.empty(dest_shape, dtype)
            else:
                dest = scratch.get(("temp", j))
                if dest is None or dest.shape != dest_shape or dest.dtype != dtype:
                    dest = scratch[("temp", j)] = np.empty(dest_shape, dtype)
            values.append(_apply(op, operands, dtype, dest))
    return values[-1]


def evaluate_numexpr(program: Program, arrays: Sequence[np.ndarray],
                     out_shape: tuple[int, ...], block_elements: int = BLOCK_ELEMENTS
                     ) -> np.ndarray:
    """Like `evaluate`, but only through numexpr; raises ExecutionError where it cannot.

    Parameters
    ----------
    block_elements
        The most elements one block holds when the program runs in several stages.
    """
    arrays, shape = _prepare(program, arrays, out_shape)
    src = numexpr_source(program, tuple(a.dtype.name for a in arrays))
    compiled = _compiled(src, program) if src is not None else None
    if compiled is None:
        raise ExecutionError("this fused program cannot run exactly through numexpr "
                             f"(input dtypes {[a.dtype.name for a in arrays]}); use evaluate")
    if math.prod(shape) == 0:
        return np.empty(out_shape, dtype=program[-1][2])
    return _widen(_run_numexpr(src, compiled, arrays, shape, block_elements), out_shape)


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
    return "numexpr" if src is not None and _compiled(src, program) is not None else "blocked"


def estimated_cost(program: Program, stages: int = 1) -> dict[str, float]:
    """Estimated nanoseconds per output element of each path, from `OP_COST_NS`.

    Parameters
    ----------
    stages
        How many numexpr expressions the program lowers to. Every stage but the last writes
        its result to a block buffer that a later stage reads again: the memory traffic of a
        cast, so each is counted as one (not measured on its own).

    Returns
    -------
    dict
        `{"numexpr": ns, "blocked": ns}`.
    """
    ne_ns = np_ns = 0.0
    wide = 0
    for op, _, dtype in program:
        col = 0 if np.dtype(dtype).itemsize <= 4 else 1
        wide = max(wide, col)
        if op in ("maximum", "minimum") and np.dtype(dtype).kind in "iu":
            costs = _INT_MAXMIN_COST_NS
        else:
            costs = OP_COST_NS.get(op, (1.0, 1.0, 1.0, 1.0))
        ne_ns += costs[col]
        np_ns += costs[2 + col]
    ne_ns += (stages - 1) * OP_COST_NS["cast"][wide]
    return {"numexpr": ne_ns, "blocked": np_ns}


def _prepare(program: Program, arrays, out_shape) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """Check the call and return the arrays and the broadcast shape of the inputs read."""
    arrays = [np.asarray(a) for a in arrays]
    _, shape = check_call(program, [a.shape for a in arrays], out_shape)
    if whole_axes(program):
        shape = tuple(int(s) for s in out_shape)  # normalized over the whole axis
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
    out = recycled.empty(out_shape, result.dtype)
    out[...] = result
    return out


# ---------------------------------------------------------------------------------------------
# numexpr path

_CHOICES: dict[tuple[str, tuple[str, ...]], NumexprSource | None] = {}
_CACHE_MAX = 4096
_local = threading.local()
_threads_lock = threading.Lock()
_threads_set = False


def numexpr_source(program: Program, in_dtypes: tuple[str, ...]) -> NumexprSource | None:
    """Lower a program to numexpr stages, or None where numexpr cannot run it exactly (see
    `fused_numexpr`). A pure function of the program and the dtypes of the task's inputs.

    Raises
    ------
    CodegenError
        When generating the code fails (it runs out of memory or recursion depth): a failure
        of the code generator, which smaller chunks would not avoid.
    """
    if ne is None:
        return None
    try:
        return fused_numexpr.numexpr_source(program, tuple(in_dtypes))
    except (MemoryError, RecursionError) as err:
        raise _codegen_error(program, "generating", err) from err


def _choice(program: Program, in_dtypes: tuple[str, ...]) -> NumexprSource | None:
    """The numexpr source to run, or None for the blocked path; cached per program and dtypes.

    The cost table is read first, so programs numexpr would run slower are never lowered;
    then once more with the stages the lowering took. The cache key is the program's repr,
    which (unlike tuple equality) tells 0.0 from -0.0 and matches NaN constants.
    """
    key = (repr(program), in_dtypes)
    try:
        return _CHOICES[key]
    except KeyError:
        pass
    cost = estimated_cost(program)
    src = numexpr_source(program, in_dtypes) if cost["numexpr"] < cost["blocked"] else None
    if src is not None and len(src.stages) > 1:
        if estimated_cost(program, len(src.stages))["numexpr"] >= cost["blocked"]:
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


def _compiled(src: NumexprSource, program: Program) -> list | None:
    """This thread's compiled numexpr programs for the stages of `src`, or None where numexpr
    has no kernel for one of their operations (the blocked path is for those).

    Anything else numexpr refuses is generated code that cannot compile (a limit passed, a
    gap in the lowering) and raises CodegenError, instead of being hidden by the fallback.
    """
    cache = getattr(_local, "compiled", None)
    if cache is None:
        cache = _local.compiled = {}
    out = []
    for stage in src.stages:
        nex = cache.get(stage.key)
        if nex is None:
            nex = _compile_stage(stage, program)
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            cache[stage.key] = nex
        if nex is False:
            return None
        out.append(nex)
    return out


def _compile_stage(stage, program: Program):
    """The compiled numexpr program of one stage, or False if numexpr lacks an opcode."""
    _set_numexpr_threads()
    try:
        nex = ne.NumExpr(stage.expression, signature=list(stage.signature))
    except NotImplementedError:  # "couldn't find matching opcode": numexpr lacks a kernel
        return False
    except Exception as err:
        raise _codegen_error(program, "compiling", err) from err
    # The result kind must be the stage's; anything else is a lowering gap.
    if nex.fullsig[:1] != fused_numexpr.NE_TYPES[stage.dtype][1]:
        return False
    return nex


def _codegen_error(program: Program, step: str, err: BaseException) -> CodegenError:
    return CodegenError(
        f"{step} the numexpr code of a fused program of {len(program)} instructions failed "
        f"({type(err).__name__}: {str(err)[:200] or 'no message'}). This is a limit of "
        "deepx_flow's code generator, not a lack of memory for the data: smaller chunks "
        "would not help; please report it with the graph")


def _run_numexpr(src: NumexprSource, compiled: list, arrays: list[np.ndarray], shape,
                 block_elements: int, out: np.ndarray | None = None) -> np.ndarray:
    out = recycled.empty(shape, src.out_dtype) if out is None else out
    # ex_uses_vml only asks for contiguous, aligned buffers: always safe to pass when VML is on.
    vml = bool(ne.use_vml)
    if len(src.stages) == 1:
        args = [arrays[o[1]] if o[0] == "in" else o[1] for o in src.stages[0].operands]
        compiled[0](*args, out=out, order="K", casting="unsafe", ex_uses_vml=vml)
        return out
    # Several stages run block by block, like the blocked path, so the stages' results live
    # in cache-sized buffers that are reused once no later stage reads them.
    n = len(src.stages)
    views = {o[1]: np.broadcast_to(arrays[o[1]], shape)
             for s in src.stages for o in s.operands if o[0] == "in"}
    steps = tuple(("stage", tuple(("t", o[1]) for o in s.operands if o[0] == "s"), s.dtype)
                  for s in src.stages)
    slots, slot_dtypes, _ = _allocate(steps)
    block = max(1, min(int(block_elements), math.prod(shape)))
    buffers = _block_buffers(slot_dtypes, block)
    for key in iter_blocks(shape, block):
        target = out[key]
        bshape, m = target.shape, target.size
        results: list[Any] = [None] * n
        for i, (stage, nex) in enumerate(zip(src.stages, compiled)):
            args = [views[o[1]][key] if o[0] == "in" else o[1] if o[0] == "c"
                    else results[o[1]] for o in stage.operands]
            dest = target if i == n - 1 else buffers[slots[i]][:m].reshape(bshape)
            nex(*args, out=dest, order="K", casting="unsafe", ex_uses_vml=vml)
            results[i] = dest
    return out


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


def hoisted(program: Program, arrays: Sequence[np.ndarray], invariant: set[int]) -> dict:
    """The values of the instructions that read only inputs in `invariant` (those every block
    of a blockwise evaluation shares: a bias, `sqrt(variance)`), constants and one another,
    each computed once at its own (broadcast) shape with the arithmetic of the blocked path;
    for `evaluate(..., fixed=)`, which cuts them into blocks as it cuts the inputs. The last
    instruction and whole-axis ones are left out.

    Parameters
    ----------
    invariant
        Indices of the inputs that are the same for every block.
    """
    out: dict = {}
    with np.errstate(all="ignore"):
        for j, (op, args, dtype) in enumerate(program[:-1]):
            if op in WHOLE_AXIS_OPS or not all(
                    a[0] == "c" or (a[0] == "in" and a[1] in invariant) or
                    (a[0] == "t" and a[1] in out) for a in args):
                continue
            operands = [np.asarray(arrays[a[1]]) if a[0] == "in" else out[a[1]]
                        if a[0] == "t" else constant(a[1], a[2]) for a in args]
            shape = np.broadcast_shapes(*[np.shape(o) for o in operands])
            out[j] = _apply(op, operands, dtype, np.empty(shape, dtype))
    return out


def prepared_blocks(program: Program, dtypes: Sequence[str], block_shape: tuple[int, ...],
                    fixed: dict | None = None):
    """The blocked path prepared once for many blocks of at most `block_shape` (a reduction's
    prologue, block by block): a function `run(arrays, out)` that evaluates the program on
    the block's input arrays (`dtypes`, broadcasting to `out`) into `out`, a C-contiguous
    array of the result's dtype. Its constants, temporaries' buffers and each instruction's
    ufunc are found here, so a block costs its ufunc calls alone: the set-up of
    `_run_blocked` (about 30 us a call) would otherwise be paid per block, and blocks small
    enough to stay in cache are what make the arithmetic fast. `fixed`: instruction index ->
    its value, the same for every block (`hoisted`).

    A whole-axis instruction (softmax, log_softmax) needs its axis whole in every block, as
    in `_run_blocked`. None where the program is not one for this path: bfloat16 anywhere,
    or numexpr chosen for it (`engine_for`). `run` uses this thread's block buffers
    (`_block_buffers`): it runs on the thread that prepared it, and nothing else evaluates a
    program on that thread between its blocks.
    """
    if "bfloat16" in dtypes or any(dtype == "bfloat16" for _, _, dtype in program) or \
            engine_for(program, dtypes) != "blocked":
        return None
    from deepx_flow.kernels.elementwise import UFUNCS
    fixed = fixed or {}
    n = len(program)
    slots, slot_dtypes, scratch = _allocate(program)
    elements = math.prod(block_shape)
    buffers = _block_buffers(slot_dtypes, elements)
    work = _block_buffers(["float32"], elements, first=len(slot_dtypes))[0] if scratch else None
    groups = _softmax_groups(program, len(slot_dtypes), elements)
    steps = []  # (j, ufunc or None, op, operand sources, dtype)
    for j, (op, args, dtype) in enumerate(program):
        if j in fixed:
            continue
        sources = [("in", a[1]) if a[0] == "in" else ("fixed", fixed[a[1]]) if
                   a[0] == "t" and a[1] in fixed else ("t", a[1]) if a[0] == "t" else
                   ("fixed", constant(a[1], a[2])) for a in args]
        if op in WHOLE_AXIS_OPS:
            sources = sources[:1]
        ufunc = getattr(np, UFUNCS[op]) if op in UFUNCS else None
        steps.append((j, ufunc, op, sources, dtype, (args[0], args[1][1]) if
                      op in WHOLE_AXIS_OPS else None))

    def run(arrays, out):
        shape, m = out.shape, out.size
        values: list[Any] = [None] * n
        shared: dict = {}
        with np.errstate(all="ignore"):
            for j, ufunc, op, sources, dtype, group in steps:
                operands = [arrays[k] if kind == "in" else values[k] if kind == "t" else k
                            for kind, k in sources]
                dest = out if j == n - 1 else buffers[slots[j]][:m].reshape(shape)
                if group is not None:
                    if group not in shared:
                        shared[group] = _normalized(operands[0], group[1], m, shape,
                                                    groups[group])
                    softmax.finish(op, shared[group], np, out=dest)
                elif ufunc is not None:
                    ufunc(*operands, out=dest, casting="unsafe")
                else:  # the rest take their operands at the block's shape, as apply_op does
                    _apply(op, [np.broadcast_to(o, shape) for o in operands], dtype, dest,
                           work[:m].reshape(shape) if work is not None else None)
                values[j] = dest
        return out
    return run


def _run_blocked(program: Program, arrays: list[np.ndarray], shape, block_elements: int,
                 out: np.ndarray | None = None, fixed: dict | None = None) -> np.ndarray:
    n = len(program)
    out = recycled.empty(shape, program[-1][2]) if out is None else out
    views = {k: np.broadcast_to(arrays[k], shape)
             for k in {a[1] for _, args, _ in program for a in args if a[0] == "in"}}
    consts = {(j, i): constant(a[1], a[2])
              for j, (_, args, _) in enumerate(program) for i, a in enumerate(args)
              if a[0] == "c"}
    slots, slot_dtypes, scratch = _allocate(program)
    fixed_views = {j: np.broadcast_to(v, shape) for j, v in (fixed or {}).items()}
    whole = whole_axes(program)
    block = max(1, min(int(block_elements), math.prod(shape)),
                math.prod(shape[whole[0]:]) if whole else 0)
    buffers = _block_buffers(slot_dtypes, block)
    # float16 sigmoid/gelu compute in float32: give them a reused float32 buffer instead of
    # letting apply_op allocate one per block.
    f32 = _block_buffers(["float32"], block, first=len(slot_dtypes))[0] if scratch else None
    groups = _softmax_groups(program, len(slot_dtypes), block)

    with np.errstate(all="ignore"):
        for key in iter_blocks(shape, block):
            target = out[key]
            bshape, m = target.shape, target.size
            values: list[Any] = [None] * n
            shared: dict = {}
            for j, (op, args, dtype) in enumerate(program):
                if fixed and j in fixed:
                    values[j] = fixed_views[j][key]  # cut like an input
                    continue
                operands = [views[a[1]][key] if a[0] == "in" else values[a[1]] if a[0] == "t"
                            else consts[(j, i)] for i, a in enumerate(args)]
                dest = target if j == n - 1 else buffers[slots[j]][:m].reshape(bshape)
                if op in WHOLE_AXIS_OPS:
                    group = (args[0], args[1][1])
                    if group not in shared:
                        # The key indexes the axes before its slice one at a time, which
                        # drops them from the block.
                        axis = group[1] - (len(key) - 1 if isinstance(key, tuple) else 0)
                        shared[group] = _normalized(operands[0], axis, m, bshape,
                                                    groups[group])
                    softmax.finish(op, shared[group], np, out=dest)
                else:
                    _apply(op, operands, dtype, dest,
                           f32[:m].reshape(bshape) if f32 is not None else None)
                values[j] = dest
    return out


def _softmax_groups(program: Program, slots: int, elements: int) -> dict:
    """Block buffers for the whole-axis instructions, by (value, axis): softmax and
    log_softmax of one value along one axis share (x - max, its exps, their sum), which the
    first of them in a block computes into its group's buffers, in the dtype softmax computes
    in (float32 for bfloat16, rounded once into the result). They are numbered after the
    program's `slots` temporaries and the float32 scratch."""
    groups: dict = {}
    for op, args, dtype in program:
        if op in WHOLE_AXIS_OPS and (args[0], args[1][1]) not in groups:
            first = slots + 1 + 3 * len(groups)
            work = softmax.value_dtype(dtype).name
            groups[(args[0], args[1][1])] = _block_buffers(
                [work, work, accumulator(work)], elements, first=first)
    return groups


def _apply(op: str, operands: list, dtype: str, dest: np.ndarray, work=None) -> np.ndarray:
    """One instruction into `dest`. float16 sigmoid and gelu compute in float32 (in `work`,
    a float32 buffer of dest's shape, when given) and round once."""
    if dtype == "float16" and op in ("sigmoid", "gelu"):
        work = np.empty(dest.shape, "float32") if work is None else work
        apply_op(op, operands, "float32", np, out=work)
        np.copyto(dest, work, casting="unsafe")
    else:
        apply_op(op, operands, dtype, np, out=dest)
    return dest


def _normalized(x, axis: int, m: int, bshape, buffers) -> softmax.Normalized:
    """`softmax.normalize` of one block of a value, in its group's three buffers (the first
    holds the value cast to the buffers' dtype first where it has another dtype)."""
    shifted, exps, wide = (b[:m].reshape(bshape) for b in buffers)
    x = np.broadcast_to(x, bshape)
    if x.dtype != shifted.dtype:
        np.copyto(shifted, x, casting="unsafe")
        x = shifted
    return softmax.normalize(x, axis, np, shifted=shifted, exps=exps,
                             wide=wide if wide.dtype != exps.dtype else None)


def _block_buffers(dtypes: Sequence[str], elements: int, first: int = 0) -> list[np.ndarray]:
    """Block buffers for one evaluation, kept per thread and reused by the next: a fused
    program is evaluated many times a task (a batch chain's blocks; `prepared_blocks` once per
    task), and a fresh buffer each time would fault in page by page on a Dask worker (whose
    glibc mmap threshold is pinned at 128 KiB). Buffer `first + i` gets `dtypes[i]`; one
    evaluation runs at a time per thread, so no two callers share a buffer."""
    pool = getattr(_local, "buffers", None)
    if pool is None:
        pool = _local.buffers = {}
    out = []
    for i, dtype in enumerate(dtypes, start=first):
        if elements > BLOCK_ELEMENTS:  # a caller's own block size: not kept
            out.append(np.empty(elements, dtype=dtype))
            continue
        buf = pool.get((i, dtype))
        if buf is None or buf.size < elements:
            buf = pool[(i, dtype)] = np.empty(BLOCK_ELEMENTS, dtype=dtype)
        out.append(buf[:elements])
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
