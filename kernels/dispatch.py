"""The one place that decides which array engine (NumPy or CuPy) a kernel runs on.

Kernels never import CuPy themselves; they ask this module. CuPy is imported lazily, and only
here, so the package imports (and every CPU kernel runs) on machines without CuPy or a GPU.

Two questions are answered here:

- Which module do these arrays belong to? (`array_module`). This never imports CuPy: if CuPy has
  not been imported yet, no argument can be a CuPy array, so the answer is NumPy.
- Which engine should this process create new arrays on? (`device_engine`). CuPy when it
  imports and the CUDA runtime sees at least one device in this process (it honours
  `CUDA_VISIBLE_DEVICES`, as dask-cuda sets it per worker). The answer is cached for the life of
  the process; asking initialises the CUDA runtime, so ask inside workers, not in a parent
  process that will fork.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any, Literal

import numpy as np

from deepx_flow.errors import ExecutionError
from deepx_flow.ir.dtypes import BFLOAT16

Engine = Literal["numpy", "cupy"]
ENGINES: tuple[str, ...] = ("numpy", "cupy")


def _loaded_cupy() -> ModuleType | None:
    """CuPy if some code in this process already imported it, else None (never imports it)."""
    return sys.modules.get("cupy")


def is_cupy_array(x: Any) -> bool:
    """True when `x` is a CuPy array (False without importing CuPy when it is not loaded)."""
    cp = _loaded_cupy()
    return cp is not None and isinstance(x, cp.ndarray)


def array_module(*arrays: Any) -> ModuleType:
    """The array module that owns the arguments: `cupy` if any of them is a CuPy array.

    Parameters
    ----------
    *arrays
        Arrays, scalars or None, in any mix.

    Returns
    -------
    module
        `cupy` when at least one argument is a CuPy array, else `numpy`.
    """
    cp = _loaded_cupy()
    if cp is not None and any(isinstance(a, cp.ndarray) for a in arrays):
        return cp
    return np


@functools.lru_cache(maxsize=1)
def device_engine() -> Engine:
    """The engine new arrays should be made on in this process: "cupy" or "numpy".

    "cupy" when CuPy imports and the CUDA runtime reports at least one visible device, else
    "numpy". Cached: the devices a process sees do not change while it runs.
    """
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "cupy"
    except Exception:  # no CuPy, no driver, no device: all mean "run on the CPU"
        pass
    return "numpy"


def to_host(x: Any) -> np.ndarray:
    """`x` as a NumPy array in host memory (copies device arrays; NumPy arrays pass through).

    Parameters
    ----------
    x
        A NumPy or CuPy array, or anything `numpy.asarray` accepts.
    """
    if is_cupy_array(x):
        return x.get()
    return np.asarray(x)


def asarray_on_engine(x: Any, engine: str) -> Any:
    """`x` as an array of `engine` ("numpy" or "cupy"), copying between devices if needed.

    Parameters
    ----------
    x
        A NumPy or CuPy array, or anything `numpy.asarray` accepts.
    engine
        "numpy" (host memory) or "cupy" (the current CUDA device).

    Raises
    ------
    ExecutionError
        For an unknown engine name.
    """
    if engine == "numpy":
        return to_host(x)
    if engine == "cupy":
        if getattr(x, "dtype", None) == BFLOAT16:
            raise ExecutionError("a bfloat16 array cannot go to a GPU: CuPy has no bfloat16 "
                                 "(the planner refuses bfloat16 on clusters with GPU workers; "
                                 "was this one described without its GPUs?)")
        import cupy
        return cupy.asarray(x)
    raise ExecutionError(f"unknown array engine {engine!r}; use one of {', '.join(ENGINES)}")
