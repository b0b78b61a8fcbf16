"""`deepx-flow gpu settings`: this node's GPUs as workers started now would register them
(total and usable memory, through NVML) and the `dask cuda worker` flags that follow (the
device-to-host spilling threshold, and the RMM pool where RMM is installed:
`registry/gpu_memory.py`). Run it before starting the node's workers: memory they hold
counts as other processes'. Exit code 1 where there is no GPU to read, saying why."""

from __future__ import annotations

import sys

from deepx_flow.registry.cluster import format_bytes
from deepx_flow.registry.gpu_memory import probe_all_nvml, rmm_installed, worker_flags
from deepx_flow.text_table import text_table


def add_parser(sub, parents) -> None:
    gpu = sub.add_parser("gpu", parents=parents, help="this node's GPUs and their settings")
    gpu_sub = gpu.add_subparsers(dest="gpu_command", required=True)
    gpu_sub.add_parser("settings", help="registered memory and the dask cuda worker flags")


def run(args) -> int:
    gpus, why = probe_all_nvml()
    if not gpus:
        print(f"deepx-flow: no GPU to read here: {why}", file=sys.stderr)
        return 1
    rmm = rmm_installed()
    rows = []
    for g in gpus:
        s = g.settings()
        rows.append((g.index, g.name, format_bytes(g.total), format_bytes(g.others),
                     format_bytes(g.usable),
                     format_bytes(s["rmm_pool_size"]) if rmm else "- (no RMM)",
                     format_bytes(s["device_memory_limit"])))
    print(text_table(("gpu", "name", "total", "held by others", "usable", "rmm pool",
                      "device memory limit"), rows))
    print("\nStart this node's workers with:\n"
          f"  dask cuda worker SCHEDULER_ADDRESS {worker_flags(gpus, rmm)}")
    return 0
