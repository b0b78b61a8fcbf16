"""Micro-benchmark of the fused CPU kernels and of numexpr threading under concurrent callers.

Measures, on this machine:

1. A 10-instruction float32 chain over one chunk: unfused NumPy (one full-size temporary per
   instruction, `apply_op` per instruction), the numexpr path, and the blocked path at several
   block sizes (this is how `fused_cpu.BLOCK_ELEMENTS` was chosen).
2. With `--ops`: nanoseconds per element and instruction of each operator on each path, for
   float32 and float64 (the source of `fused_cpu.OP_COST_NS`).
3. numexpr threading the way a Dask worker calls it (several threads, one chunk each): one call
   alone, K concurrent calls, and how long a small call waits while a large one runs, for 1 and
   for N numexpr threads.

Run: `python benchmarks/bench_fused_kernel.py [--elements 4000000] [--ops]`. It prints a table; the
numbers quoted in `kernels/fused_cpu.py` come from it.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numexpr as ne
import numpy as np

from deepx_flow.kernels import fused_cpu
from deepx_flow.kernels.elementwise import apply_op, constant

CHAIN = (
    ("mul", (("in", 0), ("c", 1.5, "float32")), "float32"),
    ("add", (("t", 0), ("in", 1)), "float32"),
    ("tanh", (("t", 1),), "float32"),
    ("mul", (("t", 2), ("in", 0)), "float32"),
    ("exp", (("t", 3),), "float32"),
    ("sub", (("t", 4), ("c", 1.0, "float32")), "float32"),
    ("maximum", (("t", 5), ("in", 1)), "float32"),
    ("sigmoid", (("t", 6),), "float32"),
    ("mul", (("t", 7), ("t", 1)), "float32"),
    ("relu", (("t", 8),), "float32"),
)


def best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def unfused(program, arrays):
    values = []
    for op, args, dtype in program:
        operands = [arrays[a[1]] if a[0] == "in" else values[a[1]] if a[0] == "t"
                    else constant(a[1], a[2]) for a in args]
        values.append(apply_op(op, operands, dtype, np))
    return values[-1]


def bench_chain(n: int) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    shape = (n,)
    print(f"10-instruction float32 chain, {n:,} elements ({n * 4 / 2**20:.0f} MiB per array)")
    t = best(lambda: unfused(CHAIN, arrays))
    print(f"  unfused NumPy                {t * 1e3:8.1f} ms")
    t = best(lambda: fused_cpu.evaluate_numexpr(CHAIN, arrays, shape))
    print(f"  numexpr path (1 thread)      {t * 1e3:8.1f} ms")
    for block in (1 << 12, 1 << 14, 1 << 15, 1 << 16, 1 << 18, 1 << 20):
        t = best(lambda: fused_cpu.evaluate_blocked(CHAIN, arrays, shape, block))
        print(f"  blocked path, {block:>8,}/block {t * 1e3:8.1f} ms")


OPS = ("add", "mul", "div", "pow", "maximum", "where", "neg", "abs", "exp", "log", "sqrt",
       "tanh", "sigmoid", "gelu", "relu", "lt", "sinh", "cosh", "asinh", "acosh", "atanh")
# Operators timed one instruction at a time, on operands inside their domain (a chain of them
# would leave it: acosh of acosh is NaN below 1, sinh of sinh overflows).
ONE_DEEP = {"sinh": (-3.0, 3.0), "cosh": (-3.0, 3.0), "asinh": (-3.0, 3.0),
            "acosh": (1.0, 4.0), "atanh": (-0.9, 0.9)}


def op_chain(op: str, dtype: str, length: int):
    """`length` instructions of `op`, each reading the previous result (and input 1 or 2)."""
    program: list = []
    for _ in range(length):
        prev = ("t", len(program) - 1) if program else ("in", 0)
        if op == "where":
            program.append(("where", (("in", 2), prev, ("in", 1)), dtype))
        elif op == "lt":  # a comparison cannot chain on itself: compare, then select
            program.append(("lt", (prev, ("in", 1)), "bool"))
            program.append(("where", (("t", len(program) - 1), ("in", 1), prev), dtype))
        elif op in ("add", "mul", "div", "pow", "maximum"):
            program.append((op, (prev, ("in", 1)), dtype))
        else:
            program.append((op, (prev,), dtype))
    return tuple(program)


def bench_ops(n: int) -> None:
    rng = np.random.default_rng(0)
    print(f"ns per element and instruction, {n:,} elements (numexpr path / blocked path)")
    for dtype in ("float32", "float64"):
        x = (rng.random(n) + 0.5).astype(dtype)
        y = (rng.random(n) + 0.5).astype(dtype)
        arrays = [x, y, x > 1.0]
        for op in OPS:
            # Ops whose numexpr lowering repeats its operand grow the expression quickly.
            length = 1 if op in ONE_DEEP else 3 if op in ("maximum", "gelu", "abs") else 8
            program = op_chain(op, dtype, length)
            a = [x * 0.01, y, x > 1.0] if op == "exp" else arrays
            if op in ONE_DEEP:
                lo, hi = ONE_DEEP[op]
                a = [rng.uniform(lo, hi, n).astype(dtype)]
            t_ne = best(lambda: fused_cpu.evaluate_numexpr(program, a, (n,)), 3)
            t_np = best(lambda: fused_cpu.evaluate_blocked(program, a, (n,)), 3)
            k = len(program)
            print(f"  {dtype:8s} {op:8s} {t_ne / k / n * 1e9:7.2f} {t_np / k / n * 1e9:7.2f}")


def bench_threads(n: int, cores: int) -> None:
    ex = "exp(-(a*a)) * tanh(a*b + c) / (1 + b*b) + sqrt(abs(a))"
    rng = np.random.default_rng(0)

    def chunk(size):
        return {k: rng.standard_normal(size).astype(np.float32) for k in "abc"}

    def run(d, out):
        ne.evaluate(ex, local_dict=d, out=out)

    print(f"numexpr threading, {n:,}-element float32 chunks, 9-op expression")
    for threads in sorted({1, cores}):
        ne.set_num_threads(threads)
        d, out = chunk(n), np.empty(n, np.float32)
        one = best(lambda: run(d, out))
        line = f"  {threads} numexpr thread(s): one call {one * 1e3:7.1f} ms"
        for k in (2, 4):
            ds = [chunk(n) for _ in range(k)]
            outs = [np.empty(n, np.float32) for _ in range(k)]

            def concurrent():
                ts = [threading.Thread(target=run, args=(ds[i], outs[i])) for i in range(k)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()

            tk = best(concurrent, 3)
            line += f"; {k} concurrent {tk * 1e3:7.1f} ms ({tk / one:.2f}x)"
        print(line)
        big, big_out = chunk(8 * n), np.empty(8 * n, np.float32)
        small, small_out = chunk(8192), np.empty(8192, np.float32)
        worker = threading.Thread(target=run, args=(big, big_out))
        worker.start()
        time.sleep(0.02)
        t = time.perf_counter()
        run(small, small_out)
        wait = time.perf_counter() - t
        worker.join()
        print(f"    an 8192-element call made while a {8 * n:,}-element call runs: "
              f"{wait * 1e3:.2f} ms")
    ne.set_num_threads(fused_cpu.NUMEXPR_THREADS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=4_000_000)
    parser.add_argument("--ops", action="store_true", help="also time each operator")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"numpy {np.__version__}, numexpr {ne.__version__}, {cores} cores")
    bench_chain(args.elements)
    if args.ops:
        bench_ops(args.elements // 2)
    bench_threads(args.elements, cores)


if __name__ == "__main__":
    main()
