"""GPU memory registration: what a worker's GPU has, what deepx_flow may use of it, and the
dask-cuda settings (RMM pool, device-to-host spilling) that follow from the same numbers.

Read through NVML (`nvidia-ml-py`, which dask-cuda needs too) on the worker: NVML answers
without creating a CUDA context, and sees the memory other processes hold on the GPU.

- total: the GPU's memory.
- usable: total, less what other processes hold (their CUDA contexts and allocations; this
  worker's own, such as an RMM pool it made at start, counts as usable), less
  `context_reserve(total)` for this worker's CUDA context, cuBLAS workspaces and allocator
  slack. The compiler's task budget is the usable memory (`WorkerSpec.budget`).
- the settings: dask-cuda's RMM pool takes the usable memory (`rmm_pool_size`), and spills
  Dask-held chunks to host memory beyond `device_memory_limit`, the share of it the planner
  leaves to chunks waiting between tasks (1 - DEEPX_MEMORY_FRACTION: the other part is the
  running task's working set). Both rounded down to 256 MiB, as RMM wants whole pages.

The worker's GPU is the first entry of CUDA_VISIBLE_DEVICES (dask-cuda lists each worker's
own GPU first), an index or a UUID; NVML numbers devices ignoring that variable.

`read_gpu` takes the NVML module as an argument, so the same code runs on recorded answers
in tests (NVML cannot run on a machine without the driver); `probe_nvml` uses the real one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from deepx_flow.config import settings

ROUND = 256 * 2**20  # RMM pool sizes are whole multiples of this


def context_reserve(total: int) -> int:
    """Memory kept back for the worker's CUDA context, library workspaces and allocator
    slack: 1 GiB, or 2% on GPUs of more than 50 GiB."""
    return max(2**30, total // 50)


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as a worker registers it."""

    index: int  # NVML's index (the physical GPU)
    name: str
    uuid: str
    total: int
    free: int  # NVML's free memory when read
    others: int  # held by other processes
    usable: int

    def entry(self, cuda_index: int) -> dict:
        """The device as a worker's probe reports it (`live.probe_device`), under the CUDA
        index the worker computes on."""
        return {"index": int(cuda_index), "name": self.name, "total": self.total,
                "free": self.free, "usable": self.usable}

    def settings(self) -> dict[str, int]:
        """dask-cuda's `rmm_pool_size` and `device_memory_limit` for this GPU, in bytes."""
        return spill_settings(self.usable)


def spill_settings(usable: int, memory_fraction: float | None = None) -> dict[str, int]:
    """The RMM pool (all the usable memory) and the spill threshold (the part the planner
    leaves to chunks waiting between tasks), each rounded down to `ROUND`."""
    fraction = settings().memory_fraction if memory_fraction is None else memory_fraction
    pool = usable // ROUND * ROUND
    return {"rmm_pool_size": pool,
            "device_memory_limit": int(pool * (1 - fraction)) // ROUND * ROUND}


def cluster_settings(gpus) -> dict[str, int]:
    """The settings for workers of these GPUs, one worker each (dask-cuda takes one value
    for all its workers): those of the GPU with the least usable memory."""
    return spill_settings(min(g.usable for g in gpus))


def worker_flags(gpus) -> str:
    """`dask cuda worker`'s flags for these GPUs: the protocol's, and the memory settings."""
    s = cluster_settings(gpus)
    return (f"--enable-nvlink --enable-infiniband --rmm-pool-size {s['rmm_pool_size']} "
            f"--device-memory-limit {s['device_memory_limit']}")


def visible_device(visible: str | None) -> str | int:
    """The worker's GPU in CUDA_VISIBLE_DEVICES' first entry: an index, or a UUID string
    ("GPU-...", "MIG-..."); 0 when the variable is unset."""
    first = (visible or "").split(",")[0].strip()
    if not first:
        return 0
    return int(first) if first.isdigit() else first


def read_gpu(nvml, visible: str | None = None, pid: int | None = None) -> GpuMemory:
    """The worker's GPU through `nvml` (an initialized pynvml module, or recorded answers
    with the same functions); `visible` is CUDA_VISIBLE_DEVICES, `pid` this process."""
    pid = os.getpid() if pid is None else pid
    which = visible_device(visible)
    handle = (nvml.nvmlDeviceGetHandleByIndex(which) if isinstance(which, int)
              else nvml.nvmlDeviceGetHandleByUUID(which))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    total, free, used = int(memory.total), int(memory.free), int(memory.used)
    try:
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except nvml.NVMLError:  # not supported on this GPU or driver: count no process as ours
        processes = []
    ours = sum(int(p.usedGpuMemory or 0) for p in processes if p.pid == pid)
    others = max(0, used - ours)
    usable = max(0, total - others - context_reserve(total))
    return GpuMemory(int(nvml.nvmlDeviceGetIndex(handle)), _text(nvml.nvmlDeviceGetName(handle)),
                     _text(nvml.nvmlDeviceGetUUID(handle)), total, free, others, usable)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_nvml(visible: str | None = None) -> tuple[GpuMemory | None, str]:
    """This process's GPU through the real NVML: (its memory, "") or (None, why not)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    found, why = _with_nvml(lambda nvml: [read_gpu(nvml, env)])
    return (found[0] if found else None), why


def probe_all_nvml() -> tuple[list[GpuMemory], str]:
    """The GPUs this machine's processes may use (CUDA_VISIBLE_DEVICES' entries, else every
    GPU NVML sees), as `deepx-flow gpu settings` and the embedded cluster (one worker per
    GPU) need them; or ([], why not)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")

    def read_all(nvml):
        entries = ([e for e in visible.split(",") if e.strip()] if visible is not None
                   else [str(i) for i in range(nvml.nvmlDeviceGetCount())])
        return [read_gpu(nvml, e) for e in entries]
    return _with_nvml(read_all)


def _with_nvml(read) -> tuple[list, str]:
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:  # no driver (a CPU machine), or a broken one
        return [], f"NVML cannot start ({e})"
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return [], "NVML sees no GPU"
        found = read(pynvml)
        return found, "" if found else "CUDA_VISIBLE_DEVICES names no GPU"
    except pynvml.NVMLError as e:
        return [], f"NVML could not read the GPU ({e})"
    finally:
        pynvml.nvmlShutdown()


__all__ = ["GpuMemory", "context_reserve", "spill_settings", "cluster_settings", "worker_flags", "visible_device", "read_gpu",
           "probe_nvml", "probe_all_nvml", "ROUND"]
