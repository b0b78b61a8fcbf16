"""The GPU measurements, side by side in one run, on one GPU (`run_all.sh` runs this after
tests/gpu). Each figure is a fraction of the card's own ceiling measured in the same run:

1. Ceilings: device-to-device copy bandwidth (bytes read plus written per second, CuPy's
   copy of a large array) and one large `cupy.matmul` (float32 and float16, TFLOP/s).
2. The fused chain (`bench_elementwise.chain`: ten elementwise operations, one kernel per
   chunk) against the copy bandwidth (target >= 80%: it reads its input once and writes its
   output once, as the copy does). The target is on the kernel the plan runs, on the plan's
   chunk shape, timed with CUDA events as the copy is (a graph over a few GiB takes
   milliseconds on the GPU, less than Dask takes to schedule it); the whole `dx.persist`
   over an array already on the GPU is reported beside it.
3. A chunked GEMM (the planner's tiles, each a `cupy.matmul` with its epilogue) against one
   `cupy.matmul` of the same size (target >= 90%), both timed from the call until the
   result is there, big enough (about 140 TFLOP) that scheduling is a small part.
4. The fused chain against dask.array with CuPy chunks (one CuPy call per operation and
   chunk), both on the same `LocalCUDACluster` (target >= 3x).
5. An out-of-core GEMM: `(A @ B).sum(axis=0)` with A twice the GPU's memory (A's chunks are
   made on the GPU from (seed, index) as they are needed, so they never all exist at once;
   no host could hold A either), against the in-core GEMM's throughput (target >= 50%).

The cluster is deepx_flow's embedded one on a GPU machine: a `LocalCUDACluster`, one worker
per GPU, its RMM pool and spilling set from the registered usable memory (`gpu_memory.py`).

Run: `python benchmarks/gpu/bench_gpu.py [--quick] [--tests-log FILE]` (on a machine without
a GPU it says so in one line and exits 1). Results: benchmarks/results/bench_gpu.json.
Written without a GPU to try it on (issue 19): its first run on one may need fixes.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, chain

import common  # noqa: E402
from bench_elementwise import chain  # noqa: E402


def no_gpu() -> str | None:
    """Why there is no GPU to measure here, or None."""
    try:
        import cupy
    except Exception as e:
        return f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as e:
        return f"CuPy sees no CUDA device ({type(e).__name__})"
    return None


def gpu_time(fn, repeat: int = 3) -> float:
    """Best seconds of `fn` on the GPU (CUDA events), after one warm-up."""
    import cupy
    best = float("inf")
    for i in range(repeat + 1):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        if i:
            best = min(best, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


def ceilings(copy_bytes: int, n: int) -> dict:
    import cupy
    a = cupy.ones(copy_bytes // 4, dtype=cupy.float32)
    b = cupy.empty_like(a)
    copy_s = gpu_time(lambda: cupy.copyto(b, a))
    del a, b
    out = {"copy_bytes": copy_bytes, "copy_bandwidth": 2 * copy_bytes / copy_s}
    for dtype in ("float32", "float16"):
        x = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(dtype)
        y = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(dtype)
        seconds = gpu_time(lambda: cupy.matmul(x, y))
        out[f"matmul_{dtype}_flops"] = 2 * n**3 / seconds
        del x, y
    cupy.get_default_memory_pool().free_all_blocks()
    return out


def timed(fn, repeat: int = 3) -> float:
    """Best wall seconds of `fn` (which waits for its own results), after one warm-up."""
    return common.best_of(fn, repeat=repeat, warmup=1)["best_s"]


def measure(client, quick: bool, gpu_memory: int, ceiling: dict) -> dict:
    import cupy
    import dask.array as da
    from distributed import wait

    import deepx_flow as dx
    res = {}

    # 2. the fused chain against the copy bandwidth
    rows, cols = (4096, 8192) if quick else (65536, 16384)  # 128 MiB or 4 GiB of float32
    x = dx.input("x", shape=(rows, cols), dtype="float32")
    kept = dx.persist(dx.random.normal((rows, cols), seed=0, dtype="float32"),
                      client=client).wait()
    fused = chain(x, dx.abs, dx.maximum)
    moved = 2 * rows * cols * 4

    def run_fused():
        dx.persist(fused, inputs={"x": kept}, client=client).wait().release()
    fused_s = timed(run_fused)
    program, chunk = fused_program(dx.compile(fused, client=client))
    kernel_s, chunk_bytes = client.submit(_kernel_seconds, program, chunk, pure=False).result()
    res["fused_chain"] = {"shape": (rows, cols), "seconds": fused_s,
                          "bandwidth": moved / fused_s,
                          "chunk": chunk, "kernel_seconds": kernel_s,
                          "kernel_bandwidth": chunk_bytes / kernel_s,
                          "of_copy": chunk_bytes / kernel_s / ceiling["copy_bandwidth"],
                          "whole_run_of_copy": moved / fused_s / ceiling["copy_bandwidth"]}

    # 4. dask.array with CuPy chunks, on the same cluster
    rng = da.random.RandomState(RandomState=cupy.random.RandomState)
    xd = rng.standard_normal((rows, cols), chunks=(max(1, rows // 8), cols),
                             dtype="float32").persist()
    wait(xd)

    def run_dask():
        y = chain(xd, da.abs, da.maximum).persist()
        wait(y)
        del y
    dask_s = timed(run_dask)
    res["dask_array_cupy"] = {"seconds": dask_s, "deepx_speedup": dask_s / fused_s}
    del xd
    kept.release()

    # 3. a chunked GEMM against one cupy.matmul of the same size
    m, k, n = (4096, 4096, 4096) if quick else (65536, 32768, 32768)  # 8 + 4 + 8 GiB
    a_p, b_p = (dx.persist(dx.random.normal(s, seed=i, dtype="float32"), client=client).wait()
                for i, s in enumerate(((m, k), (k, n))))
    a, b = dx.input("a", shape=(m, k), dtype="float32"), dx.input("b", shape=(k, n),
                                                                 dtype="float32")

    def run_gemm():
        dx.persist(a @ b, inputs={"a": a_p, "b": b_p}, client=client).wait().release()
    gemm_s = timed(run_gemm)
    one = client.submit(_one_matmul, m, k, n, pure=False).result()
    res["chunked_gemm"] = {"shape": (m, k, n), "seconds": gemm_s,
                           "flops": 2 * m * k * n / gemm_s, "one_matmul_flops": one,
                           "of_one_matmul": 2 * m * k * n / gemm_s / one}
    a_p.release()
    b_p.release()

    # 5. out of core: A twice the GPU's memory, made chunk by chunk on the GPU
    k2, n2 = (4096, 1024) if quick else (16384, 4096)
    m2 = 2 * gpu_memory // (4 * k2)
    big = dx.random.normal((m2, k2), seed=7, dtype="float32")
    w = dx.random.normal((k2, n2), seed=8, dtype="float32")
    out_s = timed(lambda: dx.run((big @ w).sum(axis=0), client=client, progress=False),
                  repeat=1)
    flops = 2 * m2 * k2 * n2 / out_s
    res["out_of_core_gemm"] = {"shape": (m2, k2, n2), "a_bytes": m2 * k2 * 4,
                               "gpu_memory": gpu_memory, "seconds": out_s, "flops": flops,
                               "of_in_core": flops / res["chunked_gemm"]["flops"]}
    return res


def _one_matmul(m: int, k: int, n: int) -> float:
    """On the worker: FLOP/s of one cupy.matmul of (m, k) @ (k, n) float32, from the call
    until the result is there (as the chunked GEMM is timed)."""
    import cupy
    a = cupy.random.standard_normal((m, k), dtype=cupy.float32)
    b = cupy.random.standard_normal((k, n), dtype=cupy.float32)

    best = float("inf")
    for i in range(4):  # one warm-up, best of three (no `common` on the worker)
        start = time.perf_counter()
        cupy.matmul(a, b)
        cupy.cuda.Device().synchronize()
        if i:
            best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best


def fused_program(plan):
    """The fused chain's program and the chunk shape its tasks compute, from the plan."""
    for node in plan.fused.nodes:
        program = node.attr("program")
        if program:
            return program, tuple(max(c) for c in plan.partition.chunks[node.id])
    raise RuntimeError("the plan has no fused program")


def _kernel_seconds(program, chunk) -> tuple[float, int]:
    """On the worker: the fused kernel over one chunk (CUDA events), and the bytes it moves."""
    import cupy

    from deepx_flow.kernels import fused_gpu
    x = cupy.random.standard_normal(chunk, dtype=cupy.float32)
    out = fused_gpu.evaluate(program, [x], chunk)
    return gpu_time(lambda: fused_gpu.evaluate(program, [x], chunk)), x.nbytes + out.nbytes


def tests_summary(log: str | None) -> dict | None:
    """The closing line of the tests/gpu run that run_all.sh logged."""
    if not log or not Path(log).is_file():
        return None
    lines = [line for line in Path(log).read_text().splitlines()
             if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    return {"log": log, "summary": lines[-1].strip("= ") if lines else "no summary line"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--tests-log", help="the tests/gpu log to summarize in the results")
    args = parser.parse_args()
    why = no_gpu()
    if why:
        print(f"bench_gpu: no GPU here: {why}; nothing measured")
        return 1
    import cupy

    from deepx_flow.registry.gpu_memory import probe_nvml
    from deepx_flow.runtime.cluster import start_embedded_cluster

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    gpu_memory = int(cupy.cuda.Device(0).mem_info[1])
    registered, _ = probe_nvml()
    started = time.time()
    ceiling = ceilings((512 if args.quick else 8192) * 2**20, 4096 if args.quick else 16384)
    from distributed import Client
    with start_embedded_cluster() as cluster, Client(cluster) as client:
        res = measure(client, args.quick, gpu_memory, ceiling)
    targets = [
        common.target("fused chain kernel >= 80% of the device copy bandwidth",
                      res["fused_chain"]["of_copy"], res["fused_chain"]["of_copy"] >= 0.8),
        common.target("chunked GEMM >= 90% of one cupy.matmul",
                      res["chunked_gemm"]["of_one_matmul"],
                      res["chunked_gemm"]["of_one_matmul"] >= 0.9),
        common.target("fused chain >= 3x dask.array with CuPy chunks",
                      res["dask_array_cupy"]["deepx_speedup"],
                      res["dask_array_cupy"]["deepx_speedup"] >= 3),
        common.target("out-of-core GEMM (A = 2x GPU memory) >= 50% of in-core",
                      res["out_of_core_gemm"]["of_in_core"],
                      res["out_of_core_gemm"]["of_in_core"] >= 0.5)]
    common.print_table(("measure", "value", "ceiling", "fraction"), [
        ("device copy GB/s", common.fmt(ceiling["copy_bandwidth"] / 1e9, 0), "", ""),
        ("cupy.matmul float32 TFLOP/s", common.fmt(ceiling["matmul_float32_flops"] / 1e12, 1),
         "", ""),
        ("cupy.matmul float16 TFLOP/s", common.fmt(ceiling["matmul_float16_flops"] / 1e12, 1),
         "", ""),
        ("fused chain kernel GB/s", common.fmt(res["fused_chain"]["kernel_bandwidth"] / 1e9, 0),
         common.fmt(ceiling["copy_bandwidth"] / 1e9, 0), common.fmt(res["fused_chain"]["of_copy"])),
        ("fused chain, whole dx.persist GB/s",
         common.fmt(res["fused_chain"]["bandwidth"] / 1e9, 0),
         common.fmt(ceiling["copy_bandwidth"] / 1e9, 0),
         common.fmt(res["fused_chain"]["whole_run_of_copy"])),
        ("chunked GEMM TFLOP/s", common.fmt(res["chunked_gemm"]["flops"] / 1e12, 1),
         common.fmt(res["chunked_gemm"]["one_matmul_flops"] / 1e12, 1),
         common.fmt(res["chunked_gemm"]["of_one_matmul"])),
        ("dask.array (CuPy) s / fused chain s", common.fmt(res["dask_array_cupy"]["seconds"], 3),
         common.fmt(res["fused_chain"]["seconds"], 3),
         common.fmt(res["dask_array_cupy"]["deepx_speedup"])),
        ("out-of-core GEMM TFLOP/s", common.fmt(res["out_of_core_gemm"]["flops"] / 1e12, 1),
         common.fmt(res["chunked_gemm"]["flops"] / 1e12, 1),
         common.fmt(res["out_of_core_gemm"]["of_in_core"]))],
        f"{name}: measured in one run")
    common.write_results("bench_gpu", {
        "gpu": {"name": name, "memory": gpu_memory,
                "registered": None if registered is None else vars(registered)},
        "seconds": time.time() - started, "ceilings": ceiling, "results": res,
        "tests_gpu": tests_summary(args.tests_log), "targets": targets}, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
