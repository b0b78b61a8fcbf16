"""Memory registration from a running Dask cluster.

Each worker reports its thread count and memory limit through the scheduler; workers that
can see a GPU report its name and memory through a probe that runs on the worker (CuPy is
imported there only if it is installed). The result is the `ClusterSpec` the compiler uses.
"""

from __future__ import annotations

import importlib.util

from deepx_flow.errors import ClusterError
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


def probe_worker() -> dict:
    """On a worker: its GPU (if any) and the memory its process holds already."""
    import psutil
    return {"device": probe_device(), "rss": psutil.Process().memory_info().rss}


def cluster_spec_from_client(client, wait: float = 30.0) -> ClusterSpec:
    """The ClusterSpec of the cluster behind a `distributed.Client`.

    Waits up to `wait` seconds for at least one worker, since workers may be (re)starting.
    """
    try:
        client.wait_for_workers(1, timeout=wait)
    except TimeoutError:
        raise ClusterError(f"the Dask scheduler at {client.scheduler.address} has had no "
                           f"workers for {wait:.0f} s; start some (dask worker / dask cuda "
                           f"worker)") from None
    info = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) \
        else client.scheduler_info()
    probes = client.run(probe_worker) if info["workers"] else {}
    workers = []
    for address, w in sorted(info["workers"].items()):
        probe = probes.get(address, {})
        dev = probe.get("device")
        device = DeviceSpec("gpu", dev["name"], dev["total"]) if dev else None
        limit = int(w.get("memory_limit") or 0)
        # Threaded workers share the client's process: its memory is not theirs to reserve.
        reserved = int(probe.get("rss", 0)) if limit and _separate_process(address) \
            else 0
        workers.append(WorkerSpec(str(w.get("name", address)), str(w.get("host", "")),
                                  int(w.get("nthreads", 1)), limit or _host_memory(), device,
                                  address=address, reserved=reserved))
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
