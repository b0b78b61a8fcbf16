"""Compute-storage registration: the storage tiers a worker has.

Runs on the worker, as part of the probe in `deepx_flow.registry.live`. Tiers, fastest
first, each `{"tier", "location", "capacity"}` (capacity in bytes, None when unknown):

- `device`: each GPU's memory (location: the GPU's name; capacity: its total memory);
- `host`: host memory (location "memory"; capacity: the worker's memory limit, or the
  machine's memory when the worker has no limit);
- `disk`: the worker's local directory, where Dask spills (location: its path; capacity:
  the free bytes on that file system now);
- `object`: an object store the worker can reach (location: `DEEPX_OBJECT_STORE`, any fsspec
  URL; capacity unknown), only when that setting is set where the worker runs.
"""

from __future__ import annotations

import shutil

from deepx_flow.config import settings


def probe_tiers(dask_worker, devices: list[dict]) -> list[dict]:
    """On a worker: its storage tiers, given the GPUs it reported (see `live.probe_devices`)."""
    tiers = [{"tier": "device", "location": d["name"], "capacity": d["total"]} for d in devices]
    tiers.append({"tier": "host", "location": "memory", "capacity": _host_capacity(dask_worker)})
    directory = getattr(dask_worker, "local_directory", None)
    if directory:
        try:
            free = shutil.disk_usage(directory).free
        except OSError:  # the directory vanished: still a tier, of unknown size
            free = None
        tiers.append({"tier": "disk", "location": str(directory), "capacity": free})
    store = settings().object_store
    if store:
        tiers.append({"tier": "object", "location": store, "capacity": None})
    return tiers


def _host_capacity(dask_worker) -> int:
    import psutil
    manager = getattr(dask_worker, "memory_manager", None)
    limit = getattr(manager, "memory_limit", None)
    return int(limit) if limit else int(psutil.virtual_memory().total)
