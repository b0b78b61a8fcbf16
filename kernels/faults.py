"""A fault-injecting engine: make tasks hang, run slowly, raise CUDA-like errors, or kill
their worker, on chosen workers and nodes, to test recovery without breaking real hardware.

    from deepx_flow.kernels.faults import Fault, FaultInjection
    client.register_plugin(FaultInjection([Fault("hang", node="matmul", worker=address)]))
    ...
    client.unregister_worker_plugin(FaultInjection.name)   # releases hung tasks

`fired` lists the faults that fired in a worker's process (which task, which worker), so a
test asserts about the task a fault hit rather than guessing it from timing.

Every task runs through `kernels.attempt`, which hands it to `inject` while a
`FaultInjection` plugin is installed on its worker. The errors raised are the ones real
hardware gives, by type name and message (CuPy's `OutOfMemoryError`, CUDA runtime error
codes), so the code that classifies them (`attempt.classify`) is the code that runs on GPUs.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from distributed.diagnostics.plugin import WorkerPlugin

from deepx_flow.ir.keys import node_of

KINDS = ("hang", "slow", "raise", "device-lost", "oom", "exit")

_rules: list = []
_counts: dict = {}  # rule index -> times it fired in this process
fired: list = []  # the faults that fired in this process (`Fired`), since the plugin came
_release = threading.Event()  # set when the plugin goes: hung tasks return
_lock = threading.Lock()


class OutOfMemoryError(MemoryError):
    """Raised as CuPy raises `cupy.cuda.memory.OutOfMemoryError` (a MemoryError)."""


class CUDARuntimeError(RuntimeError):
    """Raised as CuPy raises `cupy_backends.cuda.api.runtime.CUDARuntimeError`."""


@dataclass(frozen=True)
class Fault:
    """One kind of failure, for the tasks it matches.

    kind : "hang" (block until the plugin is removed), "slow" (the task takes `factor`
        times as long: after its kernel, it waits (factor - 1) times the kernel's time, as
        on a worker running at 1/factor of its speed), "raise" (a plain error),
        "device-lost" (an uncorrectable ECC error), "oom" (an out-of-memory error) or "exit"
        (the worker process dies at once).
    node : only tasks of nodes whose id starts with this (None: any).
    worker : only on the worker with this address or name (None: any).
    times : fire at most this many times per worker process (None: every time).
    over_bytes : fire only when the task's operands or result exceed this many bytes (a
        device with less memory than it registered; checked after the kernel for results).
    """

    kind: str
    node: str | None = None
    worker: str | None = None
    times: int | None = None
    over_bytes: int = 0
    factor: float = 10.0  # "slow": how many times as long

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; use one of {KINDS}")
        if self.factor < 1:
            raise ValueError(f"a slow fault's factor must be at least 1, not {self.factor}")


@dataclass(frozen=True)
class Fired:
    """A fault that fired: so a test knows which task it hit (not guessed from timing)."""

    kind: str
    task: str  # the key of the task it fired in, as text: "('sum-...@...', 9, 1)"
    chunk: str  # the key of the chunk it aimed at (an inlined source's, or the task's own)
    worker: str | None  # the worker's address


class FaultInjection(WorkerPlugin):
    """Installs `faults` on every worker (and on workers that join later)."""

    name = "deepx-fault-injection"

    def __init__(self, faults):
        self.faults = list(faults)

    def setup(self, worker) -> None:
        with _lock:
            _release.clear()
            _counts.clear()
            fired.clear()
            _rules[:] = self.faults

    def teardown(self, worker) -> None:
        with _lock:
            _rules.clear()
        _release.set()


def installed() -> bool:
    return bool(_rules)


def inject(worker, key, func, args, task=None):
    """Run `func(*args)` with the faults that match this chunk (`key`; of the task `task`,
    default the chunk's own)."""
    node = node_of(key)
    where = (str(key if task is None else task), str(key),
             getattr(worker, "address", None))
    matching = [(i, f) for i, f in enumerate(_rules) if _matches(f, worker, node)]
    slow = [f for i, f in matching if f.kind == "slow" and _fire(i, f, where)]
    matching = [(i, f) for i, f in matching if f.kind != "slow"]
    for i, fault in matching:
        if fault.over_bytes == 0 and _fire(i, fault, where):
            _fail(fault, node, 0)
    inputs = sum(getattr(a, "nbytes", 0) for a in args if hasattr(a, "dtype"))
    for i, fault in matching:
        if fault.over_bytes and inputs > fault.over_bytes and _fire(i, fault, where):
            _fail(fault, node, inputs)
    began = time.perf_counter()
    result = func(*args)
    for fault in slow:  # removing the plugin ends the wait, as it releases hung tasks
        _release.wait((fault.factor - 1) * (time.perf_counter() - began))
    size = getattr(result, "nbytes", 0)
    for i, fault in matching:
        if fault.over_bytes and size > fault.over_bytes and _fire(i, fault, where):
            _fail(fault, node, size)
    return result


def _matches(fault: Fault, worker, node: str) -> bool:
    if fault.node is not None and not node.startswith(fault.node):
        return False
    if fault.worker is not None:
        return worker is not None and fault.worker in (worker.address, str(worker.name))
    return True


def _fire(i: int, fault: Fault, where: tuple) -> bool:
    with _lock:
        if fault.times is not None and _counts.get(i, 0) >= fault.times:
            return False
        _counts[i] = _counts.get(i, 0) + 1
        fired.append(Fired(fault.kind, *where))
        return True


def _fail(fault: Fault, node: str, nbytes: int):
    if fault.kind == "hang":
        _release.wait()
        return
    if fault.kind == "exit":
        os._exit(70)
    if fault.kind == "oom":
        raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes (allocated so "
                               f"far: 0 bytes).")
    if fault.kind == "device-lost":
        raise CUDARuntimeError("cudaErrorECCUncorrectable: uncorrectable ECC error "
                               "encountered")
    raise RuntimeError(f"injected fault in a task of {node}")
