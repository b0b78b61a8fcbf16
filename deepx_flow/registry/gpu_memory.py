"""GPU memory registration: what a worker's GPU has, what deepx_flow may use of it, and the
dask-cuda settings (RMM pool, device-to-host spilling) that follow from the same numbers.

Read through NVML (`nvidia-ml-py`, which dask-cuda needs too) on the worker: NVML answers
without creating a CUDA context, and sees the memory other processes hold on the GPU.

- total: the GPU's memory.
- usable: total, less what other processes hold (their CUDA contexts and allocations; this
  worker's own, such as an RMM pool it made at start, counts as usable), less
  `context_reserve(total)` for this worker's CUDA context, cuBLAS workspaces and allocator
  slack. The compiler's task budget is the usable memory (`WorkerSpec.budget`). What is this
  worker's is told by NVML's process list (by pid) and by what the worker knows it holds
  (`own_device_bytes`: CuPy's pool, RMM's pool), since in a container NVML may list the
  host's pids, which match none of the container's.
- the settings: dask-cuda spills Dask-held chunks to host memory beyond
  `device_memory_limit`, the share of the usable memory the planner leaves to chunks
  waiting between tasks (1 - DEEPX_MEMORY_FRACTION: the other part is the running task's
  working set); where RMM is installed, its pool takes the usable memory (`rmm_pool_size`)
  and CuPy allocates from it (`rmm_allocator_external_lib_list`: without that, CuPy would
  allocate beside the pool, from what it left). Sizes rounded down to 256 MiB.

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
        """The RMM pool and the spill threshold for this GPU, in bytes."""
        return spill_settings(self.usable)


def spill_settings(usable: int, memory_fraction: float | None = None) -> dict[str, int]:
    """The RMM pool (all the usable memory) and the spill threshold (the part the planner
    leaves to chunks waiting between tasks), each rounded down to `ROUND`."""
    fraction = settings().memory_fraction if memory_fraction is None else memory_fraction
    pool = usable // ROUND * ROUND
    return {"rmm_pool_size": pool,
            "device_memory_limit": int(pool * (1 - fraction)) // ROUND * ROUND}


def rmm_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("rmm") is not None


def cluster_settings(gpus, rmm: bool | None = None) -> dict:
    """`LocalCUDACluster`'s keyword arguments for workers of these GPUs, one worker each
    (dask-cuda takes one value for all): from the GPU with the least usable memory. The RMM
    pool only where RMM is installed (dask-cuda refuses a pool without it), with CuPy told
    to allocate from it."""
    s = spill_settings(min(g.usable for g in gpus))
    if not (rmm_installed() if rmm is None else rmm):
        return {"device_memory_limit": s["device_memory_limit"]}
    return {**s, "rmm_allocator_external_lib_list": ["cupy"]}


def worker_flags(gpus, rmm: bool | None = None) -> str:
    """`dask cuda worker`'s flags for these GPUs: UCX's links, and the memory settings."""
    s = cluster_settings(gpus, rmm)
    flags = "--enable-nvlink --enable-infiniband"
    if "rmm_pool_size" in s:
        flags += f" --rmm-pool-size {s['rmm_pool_size']} --set-rmm-allocator-for-libs cupy"
    return flags + f" --device-memory-limit {s['device_memory_limit']}"


def own_device_bytes() -> int:
    """Device memory this process knows it holds: CuPy's memory pool and RMM's pool (where
    this process made one), 0 for what it cannot ask."""
    total = 0
    try:
        import cupy
        total += int(cupy.get_default_memory_pool().total_bytes())
    except Exception:  # no CuPy, or no device: nothing held through it
        pass
    try:
        import rmm
        resource = rmm.mr.get_current_device_resource()
        if hasattr(resource, "pool_size"):
            total += int(resource.pool_size())
    except Exception:  # no RMM, or no pool
        pass
    return total


def visible_device(visible: str | None) -> str | int:
    """The worker's GPU in CUDA_VISIBLE_DEVICES' first entry: an index, or a UUID string
    ("GPU-...", "MIG-..."); 0 when the variable is unset."""
    first = (visible or "").split(",")[0].strip()
    if not first:
        return 0
    return int(first) if first.isdigit() else first


def read_gpu(nvml, visible: str | None = None, pid: int | None = None,
             own: int = 0) -> GpuMemory:
    """The worker's GPU through `nvml` (an initialized pynvml module, or recorded answers
    with the same functions); `visible` is CUDA_VISIBLE_DEVICES, `pid` this process (-1:
    no process, to size memory for workers not started yet), `own` the device memory this
    process knows it holds (counted as its own when NVML's pids do not show it)."""
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
    ours = max(own, sum(int(p.usedGpuMemory or 0) for p in processes if p.pid == pid))
    others = max(0, used - ours)
    usable = max(0, total - others - context_reserve(total))
    return GpuMemory(int(nvml.nvmlDeviceGetIndex(handle)), _text(nvml.nvmlDeviceGetName(handle)),
                     _text(nvml.nvmlDeviceGetUUID(handle)), total, free, others, usable)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_nvml(visible: str | None = None, own: int = 0) -> tuple[GpuMemory | None, str]:
    """This process's GPU through the real NVML: (its memory, "") or (None, why not)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    found, why = _with_nvml(lambda nvml: [read_gpu(nvml, env, own=own)])
    return (found[0] if found else None), why


def probe_all_nvml() -> tuple[list[GpuMemory], str]:
    """The GPUs this machine's processes may use (CUDA_VISIBLE_DEVICES' entries, else every
    GPU NVML sees), as workers not started yet would find them (`deepx-flow gpu settings`,
    the embedded cluster: one worker per GPU; what this process holds is not theirs); or
    ([], why not)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")

    def read_all(nvml):
        entries = ([e for e in visible.split(",") if e.strip()] if visible is not None
                   else [str(i) for i in range(nvml.nvmlDeviceGetCount())])
        return [read_gpu(nvml, e, pid=-1) for e in entries]
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


__all__ = ["GpuMemory", "context_reserve", "spill_settings", "cluster_settings", "worker_flags",
           "own_device_bytes", "rmm_installed", "visible_device", "read_gpu", "probe_nvml",
           "probe_all_nvml", "ROUND"]
