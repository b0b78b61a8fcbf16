"""Memory and network registration: what each worker offers the compiler.

A `ClusterSpec` lists workers (threads, host memory limit, devices) and links (bandwidth and
latency within a host and between hosts). It comes from the cluster in use
(`deepx_flow.registry.live`), from a cluster file (`graphs/clusters/*.yaml`) so a plan can be
made for a cluster we do not have, or from this machine (`local_cluster_spec`). The compiler
takes its per-task memory budget from here and nowhere else.

Cluster file format (`deepx_cluster: 1`):

    deepx_cluster: 1
    name: 8xH100
    workers:
      - name: gpu            # with count > 1 the workers are named gpu0, gpu1, ...
        count: 8
        host: node0
        threads: 1
        memory: 120GiB       # host memory limit of the worker
        flops: 20e9          # per thread, used when the worker has no device
        bandwidth: 10e9      # host memory bandwidth per thread, bytes/s
        device: {kind: gpu, name: NVIDIA H100 80GB HBM3, memory: 80GiB,
                 flops: 51e12, bandwidth: 3.35e12}   # usable: 78GiB (default: all of it)
    links:
      - {scope: host, protocol: ucx, bandwidth: 450e9, latency: 2e-6}     # NVLink
      - {scope: cluster, protocol: ucx, bandwidth: 50e9, latency: 5e-6}   # InfiniBand
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import yaml

from deepx_flow.config import Settings, settings
from deepx_flow.errors import ClusterError, InputError, shown

if TYPE_CHECKING:
    from deepx_flow.registry.speeds import OperatorSpeed

# Per-thread CPU figures and Dask TCP link figures used when nothing better is registered.
# Measured on a 2-core EPYC (benchmarks/results): float64 BLAS reached about 35 GFLOP/s per
# core, and Dask moved 805 MB between two busy local workers in 3.7 s (about 0.2 GB/s); an
# idle loopback link does better, so 0.5 GB/s is a middle figure. Probing real links is the
# network registration's job.
DEFAULT_CPU_FLOPS = 30e9
# NumPy's elementwise kernels on cache-sized blocks ran at about 0.5 ns per add per element
# (kernels/fused_cpu.py OP_COST_NS); operators weigh themselves in adds (flops_per_element).
DEFAULT_CPU_ELEMENTWISE_RATE = 2e9
DEFAULT_CPU_BANDWIDTH = 8e9
DEFAULT_LINKS = {"host": (5e8, 50e-6), "cluster": (5e8, 100e-6)}

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_bytes(value, where: str = "memory") -> int:
    """`"80GiB"`, `"64 GB"`, `1e9` or `1024` as a number of bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ClusterError(f"{where}: cannot read {value!r} as a size (use e.g. 80GiB or 64GB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(n: float) -> str:
    if isinstance(n, int) and abs(n) >= 10**300:  # past what a float holds
        return f"about 10**{len(str(abs(n))) - 1} B"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.1f} {unit}" if abs(value) < 1e6 else f"{value:.3g} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator of a worker."""

    kind: str
    name: str
    memory: int
    flops: float = 50e12
    bandwidth: float = 2e12
    # What deepx_flow may use of `memory` (the total): less what other processes hold and a
    # reserve for the CUDA context (`gpu_memory.py`); None where only the total is known.
    usable: int | None = None

    @property
    def budget(self) -> int:
        return self.memory if self.usable is None else min(self.usable, self.memory)


@dataclass(frozen=True)
class WorkerSpec:
    """One Dask worker: a process with threads, a host memory limit and perhaps a GPU."""

    name: str
    host: str
    threads: int
    memory: int
    device: DeviceSpec | None = None
    flops: float = DEFAULT_CPU_FLOPS
    bandwidth: float = DEFAULT_CPU_BANDWIDTH
    address: str | None = None
    reserved: int = 0  # host memory the worker process already used when it registered
    # Operator label -> its measured speed here (`registry/speeds.py`); empty when unknown.
    speeds: Mapping[str, "OperatorSpeed"] = field(default_factory=dict, compare=False)

    @property
    def budget(self) -> int:
        """Memory the planner divides among tasks: the GPU's usable memory when there is one,
        else the host memory limit less what the worker process itself already holds."""
        return self.device.budget if self.device else max(0, self.memory - self.reserved)

    @property
    def tasks_at_once(self) -> int:
        # A dask-cuda worker runs one task at a time per GPU thread; CPU workers one per thread.
        return max(1, self.threads)

    @property
    def compute_rate(self) -> float:
        return self.device.flops if self.device else self.flops * self.threads

    @property
    def elementwise_rate(self) -> float:
        """Elementwise operations per second (an `add` on one element is one operation)."""
        if self.device:
            return self.device.bandwidth / 8  # memory-bound: about one 8-byte read per op
        return DEFAULT_CPU_ELEMENTWISE_RATE * self.threads

    @property
    def memory_rate(self) -> float:
        return self.device.bandwidth if self.device else self.bandwidth * self.threads


@dataclass(frozen=True)
class LinkSpec:
    scope: str  # "host": between workers on one host; "cluster": between hosts
    protocol: str
    bandwidth: float
    latency: float


@dataclass(frozen=True)
class ClusterSpec:
    """What the compiler knows of a cluster."""

    name: str
    workers: tuple[WorkerSpec, ...]
    links: tuple[LinkSpec, ...] = field(default=())
    source: str = ""

    def __post_init__(self):
        if not self.workers:
            raise ClusterError(f"cluster '{self.name}' has no workers")

    @property
    def total_threads(self) -> int:
        return sum(w.tasks_at_once for w in self.workers)

    @property
    def has_devices(self) -> bool:
        return any(w.device for w in self.workers)

    def task_budget(self, config: Settings | None = None) -> int:
        """Bytes one task may use: the smallest worker's share of its usable memory
        (budget x memory_fraction / tasks at once)."""
        config = config or settings()
        return min(int(w.budget * config.memory_fraction) // w.tasks_at_once
                   for w in self.workers)

    def link(self, scope: str) -> LinkSpec:
        for link in self.links:
            if link.scope == scope:
                return link
        bandwidth, latency = DEFAULT_LINKS[scope]
        return LinkSpec(scope, "tcp", bandwidth, latency)

    @property
    def typical_link(self) -> LinkSpec:
        """The link a typical transfer between two workers takes."""
        hosts = {w.host for w in self.workers}
        return self.link("host" if len(hosts) == 1 else "cluster")

    @property
    def transfer_bandwidth(self) -> float:
        """Bandwidth of a typical transfer between two workers."""
        return self.typical_link.bandwidth


def _number(entry: dict, key: str, default, where: str, kind=float):
    try:
        return kind(entry.get(key, default))
    except (TypeError, ValueError):
        raise ClusterError(f"{where}: '{key}' must be a number, got {entry.get(key)!r}") from None


def cluster_from_dict(data: dict, source: str = "") -> ClusterSpec:
    """A ClusterSpec from a parsed cluster file; ClusterError names the file and entry."""
    where = source or "cluster spec"
    if not isinstance(data, dict) or data.get("deepx_cluster") != 1:
        raise ClusterError(f"{where}: a cluster file starts with 'deepx_cluster: 1'")
    entries = data.get("workers") or []
    if not isinstance(entries, list):
        raise ClusterError(f"{where}: 'workers' must be a list of worker entries")
    workers = []
    for i, entry in enumerate(entries):
        at = f"{where}: worker entry {i}"
        if not isinstance(entry, dict) or "memory" not in entry:
            raise ClusterError(f"{at} needs at least 'memory'")
        dev = entry.get("device")
        device = None
        if dev is not None:
            if not isinstance(dev, dict) or "memory" not in dev:
                raise ClusterError(f"{at}: device needs 'memory'")
            device = DeviceSpec(kind=str(dev.get("kind", "gpu")), name=str(dev.get("name", "gpu")),
                                memory=parse_bytes(dev["memory"], f"{at}: device memory"),
                                flops=_number(dev, "flops", DeviceSpec.flops, at),
                                bandwidth=_number(dev, "bandwidth", DeviceSpec.bandwidth, at),
                                usable=parse_bytes(dev["usable"], f"{at}: device usable")
                                if dev.get("usable") is not None else None)
        count = _number(entry, "count", 1, at, int)
        base = str(entry.get("name", f"worker{i}"))
        for k in range(count):
            workers.append(WorkerSpec(
                name=f"{base}{k}" if count > 1 else base,
                host=str(entry.get("host", "localhost")),
                threads=_number(entry, "threads", 1, at, int),
                memory=parse_bytes(entry["memory"], f"{at}: memory"),
                device=device,
                flops=_number(entry, "flops", DEFAULT_CPU_FLOPS, at),
                bandwidth=_number(entry, "bandwidth", DEFAULT_CPU_BANDWIDTH, at)))
    links = []
    for i, entry in enumerate(data.get("links") or []):
        at = f"{where}: link entry {i}"
        if not isinstance(entry, dict) or entry.get("scope") not in DEFAULT_LINKS:
            raise ClusterError(f"{at}: 'scope' must be 'host' or 'cluster'")
        if "bandwidth" not in entry:
            raise ClusterError(f"{at} needs 'bandwidth' (bytes/s)")
        links.append(LinkSpec(entry["scope"], str(entry.get("protocol", "tcp")),
                              _number(entry, "bandwidth", 0, at),
                              _number(entry, "latency", 0.0, at)))
    return ClusterSpec(str(data.get("name", Path(source).stem if source else "cluster")),
                       tuple(workers), tuple(links), source)


def load_cluster_file(path) -> ClusterSpec:
    """Read a cluster file (see the module docstring); ClusterError names the file, and
    InputError says what `cluster=` takes when `path` is no path."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"cluster must be a dx.ClusterSpec or the path of a cluster file "
                         f"(graphs/clusters/*.yaml), got {type(path).__name__} {shown(path)}")
    path = Path(path)
    try:
        if not path.is_file():  # a folder or a device would be read as text, or forever
            raise ClusterError(f"cluster file {path} "
                               f"{'is not a regular file' if path.exists() else 'does not exist'}")
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ClusterError(f"{path}: not valid YAML: {err}") from None
    except (OSError, ValueError) as err:  # unreadable, not text, a NUL in the path
        raise ClusterError(f"cannot read cluster file {shown(str(path))}: {err}") from None
    return cluster_from_dict(data, str(path))


def local_layout(cores: int | None = None) -> tuple[int, int]:
    """(workers, threads per worker) for an embedded cluster on this machine."""
    cores = cores or os.cpu_count() or 1
    n_workers = max(1, min(cores, 4 if cores >= 8 else cores))
    return n_workers, max(1, cores // n_workers)


def local_cluster_spec() -> ClusterSpec:
    """The spec of the embedded cluster `dx.run` would start on this machine."""
    import psutil
    n_workers, threads = local_layout()
    memory = psutil.virtual_memory().total // n_workers
    workers = tuple(WorkerSpec(f"local{i}", "localhost", threads, memory)
                    for i in range(n_workers))
    return ClusterSpec("local", workers, (), "this machine")


