"""Whether this process runs the kernels numba compiles (`depthwise_cpu`, `fused_numba`,
`max_pool_cpu`, `reduce_numba`, `rows_numba`), or their NumPy forms, which give the same
numbers.

numba and the LLVM it compiles with take memory of their own, outside any task's budget:
measured in one process, importing numba 53 MB and compiling the first program 72 MB more.
A Dask worker given less memory than MIN_WORKER_MEMORY (the tests' workers of 256 MiB that
stream inputs three times their size) would pass its limit on that alone, so it keeps to
NumPy; outside a worker, or on a worker without a limit, the compiled kernels run.
"""

from __future__ import annotations

import functools

MIN_WORKER_MEMORY = 1 << 30


@functools.cache
def allowed() -> bool:
    """Whether compiled kernels run in this process (decided once: a worker's memory limit
    does not change while it lives)."""
    try:
        from distributed import get_worker
        limit = get_worker().memory_manager.memory_limit
    except (ImportError, ValueError, AttributeError):
        return True  # not on a Dask worker
    return not limit or limit >= MIN_WORKER_MEMORY
