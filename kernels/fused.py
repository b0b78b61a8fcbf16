"""Fused elementwise programs: one entry point that picks the engine by where the data lives.

CuPy arrays go to the generated CUDA kernel (`fused_gpu`), everything else to the one-pass CPU
evaluator (`fused_cpu`). The choice is made by `dispatch.array_module`, the one place that
decides devices, so this module never imports CuPy.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from deepx_flow.ir.program import Program
from deepx_flow.kernels import fused_cpu
from deepx_flow.kernels.dispatch import array_module


def evaluate(program: Program, arrays: Sequence[Any], out_shape: tuple[int, ...],
             out: Any = None, fixed: dict | None = None, scratch: dict | None = None) -> Any:
    """Evaluate a fused elementwise program on the device its input arrays live on.

    Parameters
    ----------
    program
        A fused program (see `deepx_flow.ir.program`).
    arrays
        The task's input arrays: NumPy arrays, or CuPy arrays (then NumPy arrays among them
        are copied to the device).
    out_shape
        The task's output shape; the inputs must broadcast to it.
    out
        A NumPy array to write the result into where it fits (see `fused_cpu.evaluate`); the
        GPU engine allocates its own.
    fixed
        Values of instructions computed once already (`fused_cpu.hoisted`); CPU only.
    scratch
        A dict the CPU engine keeps a small program's temporaries in, to use them again on
        the next call with the same shapes (`fused_cpu.evaluate`).

    Returns
    -------
    array
        An array of shape `out_shape` and the dtype of the program's last instruction, of the
        same array module as the inputs.
    """
    if array_module(*arrays) is not np:
        from deepx_flow.kernels import fused_gpu
        return fused_gpu.evaluate(program, arrays, out_shape)
    return fused_cpu.evaluate(program, arrays, out_shape, out=out, fixed=fixed,
                              scratch=scratch)
