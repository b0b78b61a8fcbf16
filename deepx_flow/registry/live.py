"""Memory registration from a running Dask cluster.

Each worker reports its thread count and memory limit through the scheduler; a probe that
runs on the worker adds its GPU where CuPy (imported there only if it is installed) sees one:
name, total, free and usable memory, through NVML (`gpu_memory.py`). It adds the memory its
process holds already, and its storage tiers (`storage_tiers.py`). The result is the
`ClusterSpec` the compiler uses. `deepx_flow.registry.register` does the same and also
records it in the metadata database.
"""

from __future__ import annotations

import importlib.util

from deepx_flow.errors import ClusterError
from deepx_flow.registry.cluster import ClusterSpec, DeviceSpec, WorkerSpec


def probe_device() -> dict | None:
    """On a worker: the GPU this process computes on (CUDA index, name, total, free and
    usable memory: `gpu_memory.py`), or None when CuPy sees none (a CPU worker)."""
    if importlib.util.find_spec("cupy") is None:
        return None
    from deepx_flow.registry.gpu_memory import context_reserve, own_device_bytes, probe_nvml
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        device = cupy.cuda.Device()
        own = own_device_bytes()
        gpu, _ = probe_nvml(own=own)  # NVML creates no CUDA context, sees other processes
        if gpu is not None:
            return gpu.entry(device.id)
        free, total = device.mem_info
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return {"index": int(device.id), "name": name, "total": int(total), "free": int(free),
                "usable": max(0, int(free) + own - context_reserve(int(total)))}
    except Exception:  # no driver, no device, or a broken install: a CPU worker
        return None


def probe_devices() -> list[dict]:
    """On a worker: the GPUs it computes on, each with index, name, total and free memory.

    That is the current CUDA device (dask-cuda lists the worker's own GPU first in
    CUDA_VISIBLE_DEVICES); other visible GPUs are not the worker's, and asking CuPy for
    their free memory would create a CUDA context (hundreds of MiB) on each of them.
    """
    device = probe_device()
    return [device] if device else []


def probe_worker(dask_worker=None) -> dict:
    """On a worker: its GPUs, the memory its process holds already and its storage tiers.

    `client.run` passes `dask_worker`; without it (called in this process) there is no
    local directory to report as a disk tier.
    """
    import psutil

    from deepx_flow.registry.storage_tiers import probe_tiers
    devices = probe_devices()
    return {"device": devices[0] if devices else None, "devices": devices,
            "rss": psutil.Process().memory_info().rss,
            "tiers": probe_tiers(dask_worker, devices)}


def probe_cluster(client, wait: float = 30.0) -> dict[str, tuple[dict, dict]]:
    """`{address: (the scheduler's info on the worker, the worker's own probe)}`.

    Waits up to `wait` seconds for at least one worker, since workers may be (re)starting.
    """
    try:
        client.wait_for_workers(1, timeout=wait)
    except TimeoutError:
        raise ClusterError(f"the Dask scheduler at {client.scheduler.address} has had no "
                           f"workers for {wait:.0f} s; start some (dask worker / dask cuda "
                           f"worker)") from None
    workers = scheduler_workers(client)
    probes = client.run(probe_worker) if workers else {}
    # A worker that joined between the two calls has no info yet; one that left, no probe.
    return {address: (w, probes[address]) for address, w in sorted(workers.items())
            if address in probes}


def scheduler_workers(client) -> dict[str, dict]:
    """The scheduler's info on every worker, by address (all of them, not the first few
    that newer versions of `scheduler_info` return by default)."""
    if not _takes_n_workers(client):
        return client.scheduler_info()["workers"]
    # Asked of the scheduler directly: `scheduler_info` returns the client's cache, which
    # its periodic refresh (asking for no workers) can overwrite between the update and
    # the read, giving an empty "workers".
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def worker_spec(address: str, info: dict, probe: dict) -> WorkerSpec:
    """The WorkerSpec of one worker from the scheduler's info and its probe."""
    dev = probe.get("device")
    device = DeviceSpec("gpu", dev["name"], dev["total"], usable=dev.get("usable")) \
        if dev else None
    limit = int(info.get("memory_limit") or 0)
    # Threaded workers share the client's process: its memory is not theirs to reserve.
    reserved = int(probe.get("rss", 0)) if limit and _separate_process(address) else 0
    return WorkerSpec(str(info.get("name", address)), str(info.get("host", "")),
                      int(info.get("nthreads", 1)), limit or _host_memory(), device,
                      address=address, reserved=reserved)


def cluster_spec_from_client(client, wait: float = 30.0) -> ClusterSpec:
    """The ClusterSpec of the cluster behind a `distributed.Client` (links: the defaults).

    Waits up to `wait` seconds for at least one worker, since workers may be (re)starting.
    """
    workers = [worker_spec(address, info, probe)
               for address, (info, probe) in probe_cluster(client, wait).items()]
    return ClusterSpec(f"dask {client.scheduler.address}", tuple(workers), (),
                       "scheduler " + str(client.scheduler.address))


def _separate_process(address: str) -> bool:
    return not address.startswith("inproc://")


def _takes_n_workers(client) -> bool:
    import inspect
    return "n_workers" in inspect.signature(client.scheduler_info).parameters


def _host_memory() -> int:
    import psutil
    return psutil.virtual_memory().total
