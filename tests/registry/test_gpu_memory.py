"""GPU memory registration against recorded NVML answers.

NVML cannot run here: it needs NVIDIA's driver (libnvidia-ml.so), which a machine without a
GPU does not have. So `read_gpu` is given `RecordedNVML`, which answers NVML's calls from the
figures an H100 and an H200 report (total memory as nvidia-smi's MiB, the driver's own
reservation in `used`, the compute processes and their memory), through the same functions
and error type as pynvml. Everything after the answers is the real code: the usable memory,
the worker's WorkerSpec and the planner's task budget, the database row, the dask-cuda
settings and `deepx-flow gpu settings`. On this machine the real NVML is asked too, and
must say why it cannot answer.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from sqlmodel import select

from deepx_flow.meta import open_db
from deepx_flow.meta.models import Device
from deepx_flow.registry.cluster import ClusterSpec
from deepx_flow.registry.gpu_memory import (ROUND, cluster_settings, context_reserve,
                                            probe_all_nvml, probe_nvml, read_gpu,
                                            spill_settings, visible_device, worker_flags)
from deepx_flow.registry.live import worker_spec

MiB, GiB = 2**20, 2**30
H100 = 81559 * MiB  # "NVIDIA H100 80GB HBM3": nvidia-smi's 81559 MiB
H200 = 143771 * MiB  # "NVIDIA H200": 143771 MiB
DRIVER = 535 * MiB  # what an idle GPU shows used: the driver's reservation, no process


class RecordedNVML:
    """pynvml's functions for a machine whose GPUs answered as `gpus` says."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus, processes_supported=True):
        self.gpus = gpus
        self.processes_supported = processes_supported

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for i, g in enumerate(self.gpus):
            if g["uuid"] == uuid:
                return i
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetIndex(self, h):
        return h

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"]

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h]["uuid"]

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self.gpus[h]
        used = DRIVER + sum(p[1] for p in g["processes"])
        return SimpleNamespace(total=g["total"], used=used, free=g["total"] - used)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if not self.processes_supported:
            raise self.NVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=n) for pid, n in self.gpus[h]["processes"]]


ME, OTHER = 1000, 2000  # this worker's pid, another program's


def node(*processes_per_gpu, total=H100, name=b"NVIDIA H100 80GB HBM3"):
    return RecordedNVML([{"name": name, "uuid": f"GPU-5e1f{i:04d}-0000", "total": total,
                          "processes": list(p)} for i, p in enumerate(processes_per_gpu)])


def test_an_idle_gpu_is_usable_but_for_the_drivers_part_and_a_context_reserve():
    gpu = read_gpu(node(()), visible=None, pid=ME)
    assert (gpu.index, gpu.name, gpu.total, gpu.others) == (0, "NVIDIA H100 80GB HBM3", H100,
                                                          DRIVER)
    assert gpu.free == H100 - DRIVER
    assert context_reserve(H100) == H100 // 50 > GiB  # 2% on a GPU of 80 GB
    assert context_reserve(16 * GiB) == GiB
    assert gpu.usable == H100 - DRIVER - H100 // 50


def test_memory_other_processes_hold_is_not_usable_and_the_workers_own_pool_is():
    # An H200 shared with another program (20 GiB); this worker made a 100 GiB RMM pool.
    gpu = read_gpu(node([(OTHER, 20 * GiB), (ME, 100 * GiB)], total=H200,
                        name=b"NVIDIA H200"), visible="0", pid=ME)
    assert gpu.others == DRIVER + 20 * GiB
    assert gpu.free == H200 - DRIVER - 120 * GiB  # NVML's free: the pool is not free
    assert gpu.usable == H200 - DRIVER - 20 * GiB - H200 // 50  # but it is ours to use
    # Where the driver cannot list processes, everything used counts as another's.
    blind = node([(OTHER, 20 * GiB), (ME, 100 * GiB)], total=H200)
    blind.processes_supported = False
    assert read_gpu(blind, "0", pid=ME).usable == H200 - DRIVER - 120 * GiB - H200 // 50


def test_in_a_container_the_memory_a_worker_knows_it_holds_is_its_own():
    # NVML lists the host's pid (4242) for this worker's 100 GiB pool: no pid matches ours.
    gpu = node([(OTHER, 20 * GiB), (4242, 100 * GiB)], total=H200)
    assert read_gpu(gpu, "0", pid=ME).usable == H200 - DRIVER - 120 * GiB - H200 // 50
    assert read_gpu(gpu, "0", pid=ME, own=100 * GiB).usable == \
        H200 - DRIVER - 20 * GiB - H200 // 50
    # Sizing workers not started yet (pid -1): everything held now is someone else's.
    assert read_gpu(gpu, "0", pid=-1).others == DRIVER + 120 * GiB


def test_the_workers_gpu_is_the_first_visible_one_by_index_or_uuid():
    nvml = node((), [(OTHER, 8 * GiB)], (), [(OTHER, 30 * GiB)])
    assert visible_device(None) == visible_device("") == 0
    assert visible_device("3,0,1") == 3 and visible_device("GPU-5e1f0001-0000") == \
        "GPU-5e1f0001-0000"
    assert read_gpu(nvml, "3,0", pid=ME).others == DRIVER + 30 * GiB
    by_uuid = read_gpu(nvml, "GPU-5e1f0001-0000,GPU-5e1f0000-0000", pid=ME)
    assert (by_uuid.index, by_uuid.others) == (1, DRIVER + 8 * GiB)
    with pytest.raises(RecordedNVML.NVMLError):
        read_gpu(nvml, "GPU-missing", pid=ME)


def test_the_planner_budgets_the_usable_memory_and_the_registry_records_it(tmp_path):
    gpu = read_gpu(node([(OTHER, 10 * GiB)]), "0", pid=ME)
    entry = gpu.entry(0)
    probe = {"device": entry, "devices": [entry], "rss": 0, "tiers": []}
    info = {"name": "gpu0", "host": "node0", "nthreads": 1, "memory_limit": 120 * GiB}
    spec = worker_spec("ucx://10.0.0.5:40000", info, probe)
    assert spec.device.memory == H100 and spec.device.usable == gpu.usable
    assert spec.budget == gpu.usable < H100 - 10 * GiB  # not the total, as before
    cluster = ClusterSpec("one gpu", (spec,))
    assert cluster.task_budget() == int(gpu.usable * 0.5)  # DEEPX_MEMORY_FRACTION's share

    from deepx_flow.registry.register import _record_worker
    db = open_db(f"sqlite:///{tmp_path / 'deepx.db'}")
    with db.session() as s:
        _record_worker(s, "ucx://10.0.0.1:8786", spec, info, probe, now=1.0)
    with db.read() as s:
        [row] = s.exec(select(Device)).all()
    assert (row.memory_total, row.memory_free, row.memory_usable) == (
        H100, gpu.free, gpu.usable)
    from deepx_flow.cli.registry_cmd import _device_text
    from deepx_flow.registry.cluster import format_bytes
    assert _device_text(row) == (f"NVIDIA H100 80GB HBM3 {format_bytes(H100)} "
                                 f"({format_bytes(gpu.free)} free, "
                                 f"{format_bytes(gpu.usable)} usable)")


def test_the_rmm_pool_and_spilling_follow_from_the_same_numbers(monkeypatch):
    gpu = read_gpu(node(()), "0", pid=ME)
    s = gpu.settings()
    assert s["rmm_pool_size"] % ROUND == 0 and s["device_memory_limit"] % ROUND == 0
    assert gpu.usable - ROUND < s["rmm_pool_size"] <= gpu.usable
    # Spilling starts where the chunks waiting between tasks would eat into the running
    # task's budget (the planner's memory fraction of the pool).
    assert s["device_memory_limit"] == int(s["rmm_pool_size"] * 0.5) // ROUND * ROUND
    monkeypatch.setenv("DEEPX_MEMORY_FRACTION", "0.75")
    assert spill_settings(gpu.usable)["device_memory_limit"] == \
        int(s["rmm_pool_size"] * 0.25) // ROUND * ROUND
    # A node's workers share one setting: the GPU with the least usable memory sets it.
    shared = node((), [(OTHER, 30 * GiB)])
    gpus = [read_gpu(shared, str(i), pid=ME) for i in range(2)]
    least = gpus[1].settings()
    assert least != gpus[0].settings()
    # With RMM, its pool, and CuPy allocating from it; without, spilling alone (dask-cuda
    # refuses a pool it cannot make).
    assert cluster_settings(gpus, rmm=True) == {**least,
                                               "rmm_allocator_external_lib_list": ["cupy"]}
    assert cluster_settings(gpus, rmm=False) == {
        "device_memory_limit": least["device_memory_limit"]}
    assert worker_flags(gpus, rmm=True) == (
        f"--enable-nvlink --enable-infiniband --rmm-pool-size {least['rmm_pool_size']} "
        f"--set-rmm-allocator-for-libs cupy --device-memory-limit "
        f"{least['device_memory_limit']}")
    assert "--rmm-pool-size" not in worker_flags(gpus, rmm=False)


def test_here_nvml_says_why_it_cannot_answer():
    """The real NVML on this machine: with a GPU it reads one; without, it says why."""
    pytest.importorskip("pynvml")
    gpu, why = probe_nvml()
    gpus, why_all = probe_all_nvml()
    if gpu is None:
        assert why and why_all and gpus == []
        cli = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "gpu", "settings"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 1 and cli.stderr.startswith("deepx-flow: no GPU to read "
                                                            "here: ")
        assert "Traceback" not in cli.stderr
    else:  # a GPU machine (tests/gpu runs there too)
        assert gpu.total > gpu.usable > 0 and gpus
