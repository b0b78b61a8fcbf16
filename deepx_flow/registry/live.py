"""Memory registration from a running Dask cluster.

Each worker reports its thread count and memory limit through the scheduler; workers that
can see a GPU report its name and memory through a probe that runs on the worker (CuPy is
imported there only if it is installed). The result is the `ClusterSpec` the compiler uses.
"""

from __future__ import annotations

import importlib.util

from deepx_flow.registry.cluster import ClusterSpec, DeviceSpec, WorkerSpec


def probe_device() -> dict | None:
    """On a worker: the GPU this process uses (name, total and free memory), if any."""
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        device = cupy.cuda.Device()
        free, total = device.mem_info
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return {"name": name, "total": int(total), "free": int(free)}
    except Exception:  # no driver, no device, or a broken install: a CPU worker
        return None


def cluster_spec_from_client(client) -> ClusterSpec:
    """The ClusterSpec of the cluster behind a `distributed.Client`."""
    info = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) \
        else client.scheduler_info()
    devices = client.run(probe_device) if info["workers"] else {}
    workers = []
    for address, w in sorted(info["workers"].items()):
        dev = devices.get(address)
        device = DeviceSpec("gpu", dev["name"], dev["total"]) if dev else None
        memory = int(w.get("memory_limit") or 0) or _host_memory()
        workers.append(WorkerSpec(str(w.get("name", address)), str(w.get("host", "")),
                                  int(w.get("nthreads", 1)), memory, device,
                                  address=address))
    return ClusterSpec(f"dask {client.scheduler.address}", tuple(workers), (),
                       "scheduler " + str(client.scheduler.address))


def _takes_n_workers(client) -> bool:
    import inspect
    return "n_workers" in inspect.signature(client.scheduler_info).parameters


def _host_memory() -> int:
    import psutil
    return psutil.virtual_memory().total
