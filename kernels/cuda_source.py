"""The whole CUDA source CuPy compiles for a generated kernel, and NVRTC run on it with no GPU.

A fused program becomes a `cupy.ElementwiseKernel` (`fused_gpu`). CuPy wraps its body into a
`__global__` function specialized for the arguments' types (`CArray<T, ndim, contiguous,
32-bit index>`), puts its own headers in front (`carray.cuh`, `complex.cuh`, ...) and hands
that text to NVRTC at the first launch. NVRTC itself needs no device, so this module builds
the same text with the installed CuPy's own generator and compiles it, to prove on a CPU
machine that every kernel the GPU engine generates compiles (`tests/kernels`, in CI).

What needs a device in CuPy is only the choice of architecture (it asks the GPU): here the
caller names it, as PTX for a virtual architecture (`compute_80` for A100, `compute_90` for
H100 and H200). The options are CuPy's: `core.assemble_cupy_compiler_options` (its include
folders, C++17) plus what `compile_with_cache` adds (`-ftz=true`, the architecture,
`--device-as-default-execution-space`).

CuPy's generator is private API (`cupy._core._kernel`); `cuda_compiler_missing` says why it
cannot be used (no CuPy, no NVRTC, or a CuPy whose internals moved), and a test that needs it
fails with that sentence in CI, where the `nvrtc` extra installs a known CuPy.
"""

from __future__ import annotations

import functools
from typing import Sequence

from deepx_flow.errors import CodegenError
from deepx_flow.ir.program import Program

ARCHS = ("compute_80", "compute_90")  # A100; H100 and H200

# cupy._core._kernel._ArgKind: what a kernel argument is.
_NDARRAY, _INDEXER = 1, 2


@functools.lru_cache(maxsize=1)
def cuda_compiler_missing() -> str | None:
    """Why kernels cannot be compiled here (a sentence), or None when they can."""
    try:
        import cupy  # noqa: F401
        from cupy._core import _carray, _kernel, core  # noqa: F401
        from cupy_backends.cuda.libs import nvrtc
    except Exception as e:  # not installed, or a broken install
        return f"CuPy is not importable ({type(e).__name__}: {e}); pip install -e '.[nvrtc]'"
    for module, name in ((_kernel, "_ArgInfo"), (_kernel, "_get_elementwise_kernel_code"),
                         (core, "_cupy_header_list"),
                         (core, "assemble_cupy_compiler_options")):
        if not hasattr(module, name):
            return (f"this CuPy ({cupy.__version__}) has no {module.__name__}.{name}: its "
                    "kernel generator moved; kernels/cuda_source.py follows CuPy 14.2")
    try:
        nvrtc.getVersion()
    except Exception as e:  # libnvrtc not found
        return (f"NVRTC is not loadable ({type(e).__name__}: {e}); pip install "
                "nvidia-cuda-nvrtc-cu12")
    return None


def elementwise_source(in_params: str, out_params: str, body: str, name: str,
                       preamble: str, in_dtypes: Sequence[str], ndim: int = 1,
                       contiguous: Sequence[bool] | None = None) -> str:
    """The text CuPy gives NVRTC for `ElementwiseKernel(in_params, out_params, body, name,
    preamble=preamble)` called on arrays of `in_dtypes` (and a new output) of `ndim`
    dimensions after CuPy merges what it can (1 for same-shape contiguous arrays), each
    C-contiguous or not (`contiguous`, one per input; outputs are new, so contiguous), with
    32-bit indexing (chunks under 2**31 elements, as the planner makes them)."""
    import cupy
    import numpy as np
    from cupy._core import _carray, _kernel, core

    kernel = cupy.ElementwiseKernel(in_params, out_params, body, name, preamble=preamble)
    in_types = tuple(np.dtype(d) for d in in_dtypes)
    _, out_types, type_map = kernel._decide_params_type(in_types, ())
    contiguous = [True] * len(in_types) if contiguous is None else list(contiguous)
    args = tuple(_kernel._ArgInfo(_NDARRAY, cupy.ndarray, np.dtype(t), ndim, c, True)
                 for t, c in zip((*in_types, *out_types), contiguous + [True] * len(out_types)))
    args += (_kernel._ArgInfo(_INDEXER, _carray.Indexer, None, ndim, True, True),)
    code = _kernel._get_elementwise_kernel_code(args, type_map, kernel.params,
                                                kernel.operation, kernel.name, kernel.preamble)
    return "".join(f"#include <{h}>\n" for h in core._cupy_header_list) + code


def program_source(program: Program, in_dtypes: Sequence[str], ndim: int = 1,
                   contiguous: Sequence[bool] | None = None) -> str:
    """The whole source of a fused program's kernel, as `fused_gpu.evaluate` launches it on
    arrays of `in_dtypes` (the task's inputs; the kernel takes those the program reads)."""
    from deepx_flow.kernels import fused_gpu
    in_params, out_params, body = fused_gpu.kernel_source(program, in_dtypes)
    used = sorted({a[1] for _, args, _ in program for a in args if a[0] == "in"})
    return elementwise_source(in_params, out_params, body,
                              fused_gpu.kernel_name(program, in_dtypes),
                              fused_gpu.KERNEL_PREAMBLE,
                              [in_dtypes[k] for k in used], ndim,
                              None if contiguous is None else [contiguous[k] for k in used])


def options(arch: str) -> tuple[str, ...]:
    """NVRTC's options as CuPy sets them, for the virtual architecture `arch`."""
    from cupy._core import core
    return core.assemble_cupy_compiler_options(()) + (
        "-ftz=true", f"-arch={arch}", "--device-as-default-execution-space")


def compile_ptx(source: str, arch: str, name: str = "kernel") -> str:
    """PTX for `source`, compiled by NVRTC as CuPy would for `arch`. A kernel NVRTC refuses
    raises CodegenError with NVRTC's log and the numbered source lines it points at."""
    from cupy_backends.cuda.libs import nvrtc
    program = nvrtc.createProgram(source, f"{name}.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(program, options(arch))
        except nvrtc.NVRTCError as err:
            log = nvrtc.getProgramLog(program)
            raise CodegenError(f"NVRTC could not compile kernel {name} for {arch} "
                               f"({err}):\n{log}\n{numbered(source, log)}") from None
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def numbered(source: str, log: str = "", context: int = 3) -> str:
    """The source with line numbers: around each line NVRTC's log names, else all of it."""
    import re
    lines = source.splitlines()
    named = sorted({int(n) for n in re.findall(r"\.cu\((\d+)\)", log)})
    keep = set(range(1, len(lines) + 1)) if not named else {
        i for n in named for i in range(max(1, n - context), min(len(lines), n + context) + 1)}
    return "\n".join(f"{i:5d}{'>' if i in named else ' '} {lines[i - 1]}"
                     for i in sorted(keep))


__all__ = ["ARCHS", "cuda_compiler_missing", "elementwise_source", "program_source",
           "options", "compile_ptx", "numbered"]
