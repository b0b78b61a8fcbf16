"""What every task runs around its kernel: the wait before a retry, injected faults, and a
report of each failed attempt.

`attempt(func, *args)` is the function of every task the lowering builds (`taskspec.task`).
It reads the task's annotations, which the supervisor keeps up to date on the scheduler:
`deepx_failed` (failed attempts so far) and `deepx_backoff` ((first wait, cap) in seconds).
A failed attempt is reported to the scheduler as an event (`ATTEMPT_TOPIC`) with its error
and what kind of failure it was (`classify`), before Dask hears of the failure itself: Dask
keeps only the last error of a retried task, and the supervisor must know of a lost device
before Dask decides where the retry runs.

`inlined(key, func, *args)` runs a kernel computed inside another task (a source read, a
view; see `deepx_flow.compiler.inline`); `key` is the chunk it computes. Dask runs such
nested calls before the task's own function, so they wait the backoff (once per attempt,
however many a task holds) and report their failures themselves, under the task's key.
Faults aimed at the chunk's node are injected into the nested call.
"""

from __future__ import annotations

import contextlib
import threading
import time

from deepx_flow.errors import ExecutionError
from deepx_flow.kernels import faults

ATTEMPT_TOPIC = "deepx-attempt"

# CUDA errors after which a device (its CUDA context) is unusable: "sticky" errors, and the
# ones a missing or failed device gives. Matched in the error's text, as CuPy and the CUDA
# runtime name them.
DEVICE_LOST = ("cudaErrorECCUncorrectable", "cudaErrorLaunchFailure", "cudaErrorIllegalAddress",
               "cudaErrorHardwareStackError", "cudaErrorIllegalInstruction",
               "cudaErrorMisalignedAddress", "cudaErrorInvalidPc", "cudaErrorLaunchTimeout",
               "cudaErrorDevicesUnavailable", "cudaErrorNoDevice", "cudaErrorDeviceUninitialized",
               "cudaErrorUnknown", "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_LAUNCH_FAILED",
               "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_UNKNOWN")
OUT_OF_MEMORY = ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY",
                 "CUBLAS_STATUS_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED")


def classify(err: BaseException) -> str | None:
    """"oom" for running out of (device or host) memory, "device-lost" for a CUDA error
    that leaves the device unusable, None for anything else.

    An error of ours that knows its kind keeps it: a `CodegenError` is "codegen" even when
    what failed was a MemoryError while generating or compiling a kernel, because planning
    smaller chunks (what "oom" leads to) cannot help code generation.
    """
    if isinstance(err, ExecutionError) and err.kind is not None:
        return err.kind
    names = {t.__name__ for t in type(err).__mro__}
    text = f"{type(err).__name__}: {err}"
    if "MemoryError" in names or "OutOfMemoryError" in names \
            or any(s in text for s in OUT_OF_MEMORY):
        return "oom"
    if any(s in text for s in DEVICE_LOST):
        return "device-lost"
    return None


def backoff_seconds(failed: int, backoff) -> float:
    """The wait before the attempt after `failed` failed ones: the first wait, doubled for
    each later failure, at most the cap; `backoff` is (first wait, cap) or None."""
    if not failed or not backoff or backoff[0] <= 0:
        return 0.0
    first, cap = backoff
    return min(cap, first * 2 ** (failed - 1))


def attempt(func, *args):
    """Run one attempt of a task: `func(*args)`."""
    return _run(None, func, args)


def inlined(chunk_key, func, *args):
    """Run a kernel computed inside another task's attempt: `func(*args)`."""
    return _run(chunk_key, func, args)


def _run(chunk_key, func, args):
    """`func(*args)` in the running task: its backoff waited, faults aimed at `chunk_key`
    (the task's own key when None) injected, a failure reported under the task's key."""
    worker, key, annotations = _context()
    _wait_backoff(key, annotations)
    started = time.time()
    try:
        if faults.installed():
            return faults.inject(worker, key if chunk_key is None else chunk_key, func, args,
                                 task=key)
        return func(*args)
    except Exception as err:
        _report(worker, key, started, err)
        if chunk_key is not None and not hasattr(err, "deepx_chunk"):
            # The innermost inlined chunk that failed is named; kept when pickled.
            with contextlib.suppress(AttributeError):
                err.deepx_chunk = chunk_key
        raise


_waited = threading.local()  # (key, failed attempts) whose backoff this thread has waited


def _wait_backoff(key, annotations: dict) -> None:
    """Sleep the backoff of this attempt of `key`, once however many kernels it runs."""
    failed = annotations.get("deepx_failed", 0)
    wait = backoff_seconds(failed, annotations.get("deepx_backoff"))
    if wait and getattr(_waited, "attempt", None) != (key, failed):
        _waited.attempt = (key, failed)
        time.sleep(wait)


def _report(worker, key, started: float, err: BaseException) -> None:
    if worker is not None:
        worker.log_event(ATTEMPT_TOPIC, {
            "key": key, "worker": worker.address, "start": started, "stop": time.time(),
            "error": f"{type(err).__name__}: {err}"[:2000], "kind": classify(err)})


def _context():
    """This task's worker, key and annotations; (None, None, {}) outside a Dask worker."""
    from distributed.worker import get_worker, thread_state
    key = getattr(thread_state, "key", None)
    try:
        worker = get_worker()
    except ValueError:
        return None, key, {}
    ts = worker.state.tasks.get(key) if key is not None else None
    return worker, key, (ts.annotations or {}) if ts is not None else {}
