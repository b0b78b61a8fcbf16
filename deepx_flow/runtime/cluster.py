"""Finding a cluster to run on: a given client, a scheduler address, or the embedded one.

With no client and no address, deepx_flow uses this process's embedded cluster: a
`distributed.LocalCluster` sized to this machine (a `dask_cuda.LocalCUDACluster`, one worker
per GPU, when dask-cuda and GPUs are there), started on first use and kept for the process
(or notebook kernel), so ten `dx.run` calls start one cluster, not ten. It is closed at
exit, or earlier by `dx.shutdown()`; its workers are then marked gone in the registry (and
while it runs, they are marked seen: `registry/heartbeat.py`). A client the user made
(`distributed.Client()`) is used first, and never closed here.

Worker processes are started without importing the script that started them (Python's
`spawn` would run its top level again in every worker: a script without an
`if __name__ == "__main__":` guard would print its output once per worker and then fail to
start the cluster). The worker processes of a script that is imported anyway (a worker that
restarts later) stop with one line saying to add the guard.

The worker processes never take SIGINT. A terminal's Ctrl-C and a notebook's "interrupt
kernel" signal the whole process group, the workers too: each printed its KeyboardInterrupt
traceback after the driver's own clean line, and died with the chunks it held (its nanny
then started another). The driver alone is interrupted; it closes the cluster, and the
nannies stop the workers. So the cluster starts with SIGINT blocked in the starting thread:
the cluster's threads, which start (and restart) the worker processes, are made then and
keep that mask, and so does every process they start (a mask survives fork and exec, and
Python leaves it alone). A Ctrl-C while the cluster starts reaches the driver once it is up.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.machinery
import importlib.util
import logging
import signal
import sys
import threading

from deepx_flow.config import Address, address_problem, settings
from deepx_flow.errors import ClusterError, InputError, shown
from deepx_flow.registry.cluster import local_layout

log = logging.getLogger(__name__)

GUARD_HINT = ("put the script's code under `if __name__ == \"__main__\":` (Dask's worker "
              "processes import the script that starts them)")

# Clients kept for the process: the embedded cluster's ("embedded", with its cluster) and
# one per scheduler address (cluster None). Closed at exit or by `shutdown`.
_shared: dict = {}
_lock = threading.RLock()


def _gpu_count() -> int:
    if importlib.util.find_spec("dask_cuda") is None or importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def start_embedded_cluster(**kwargs):
    """A local cluster for this machine; keyword arguments override the defaults. Its
    workers' logs are silenced below CRITICAL: deepx_flow reports every failure itself, in
    one line."""
    _refuse_inside_a_worker_import()
    cpu_only = kwargs.pop("cpu", False)
    if not cpu_only and _gpu_count():
        from dask_cuda import LocalCUDACluster

        from deepx_flow.registry.gpu_memory import cluster_settings, probe_all_nvml
        options = dict(dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
        gpus, _ = probe_all_nvml()
        if gpus:  # the RMM pool and spilling from the memory the planner budgets
            options.update(cluster_settings(gpus))
        options.update(kwargs)
        with _main_not_reimported(), _interrupts_held():
            return LocalCUDACluster(**options)
    from distributed import LocalCluster
    n_workers, threads = local_layout()
    options = dict(n_workers=n_workers, threads_per_worker=threads, processes=True,
                   dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
    options.update(kwargs)
    with _main_not_reimported(), _interrupts_held():
        return LocalCluster(**options)


@contextlib.contextmanager
def _interrupts_held():
    """Block SIGINT in this thread while the cluster starts, so that the threads it makes
    and the worker processes they start never take it (see the module docstring); this
    thread gets a pending one afterwards."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process groups to signal
        yield
        return
    # Python's resource tracker, started with the first worker process, unblocks SIGINT in
    # the thread that starts it (Python 3.11's `ensure_running`): start it before.
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def _main_not_reimported():
    """While worker processes start: have Python's `spawn` leave the `__main__` module alone
    in them (it skips a main module whose spec is named `__main__`), as it does for a
    notebook. deepx_flow's tasks need nothing from the user's script."""
    main = sys.modules.get("__main__")
    if main is None or (getattr(main, "__file__", None) is None
                        and getattr(main, "__spec__", None) is None):
        yield  # a notebook or REPL: nothing would be imported
        return
    had = "__spec__" in vars(main)
    spec = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        if had:
            main.__spec__ = spec
        else:
            del main.__spec__


def _refuse_inside_a_worker_import() -> None:
    """In a worker process that is importing the script which started the cluster (it can
    happen when a worker restarts), starting a cluster would start workers that do the
    same, without end: stop the process with one line."""
    import multiprocessing
    mp_main = sys.modules.get("__mp_main__")
    if multiprocessing.parent_process() is None or mp_main is None:
        return
    frame = sys._getframe()
    while frame is not None:
        if frame.f_globals is vars(mp_main) and frame.f_code.co_name == "<module>":
            raise SystemExit(f"deepx_flow: this worker process is running the script that "
                             f"started it; {GUARD_HINT}")
        frame = frame.f_back


def current_client():
    """The Dask client this process already uses (`distributed.Client()` in a notebook)."""
    try:
        from distributed import default_client
        return default_client()
    except ValueError:
        return None


def open_client(address: str, set_as_default: bool = True):
    """A client for the scheduler at `address`, or ClusterError naming it."""
    from distributed import Client
    try:
        return Client(address, timeout="10s", set_as_default=set_as_default)
    except OSError as err:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {err}") from None


def shared_client(address: str | None = None):
    """This process's client for the scheduler at `address`, or for the embedded cluster
    (started now if it is not running). Kept until `shutdown` or exit; never the process's
    default client, so a `Client()` the user makes later is used first."""
    with _lock:
        if not _shared:
            atexit.register(shutdown)
        name = address or "embedded"
        if name in _shared and _shared[name][0].status != "running":
            _close(*_shared.pop(name))  # closed by its user: open a new one
        if name not in _shared:
            from distributed import Client
            if address:
                _shared[name] = (open_client(address, set_as_default=False), None)
            else:
                cluster = _start_or_explain()
                _shared[name] = (Client(cluster, set_as_default=False), cluster)
        return _shared[name][0]


def _start_or_explain():
    """Start the embedded cluster; a failure is one ClusterError line."""
    try:
        return start_embedded_cluster()
    except SystemExit:
        raise
    except Exception as err:
        raise ClusterError(f"could not start the embedded Dask cluster: "
                           f"{type(err).__name__}: {err}".splitlines()[0]) from None


def shutdown() -> None:
    """Close the clients this process kept, and the embedded cluster (its workers are marked
    gone in the registry). The next run starts a new one."""
    with _lock:
        shared = list(_shared.values())
        _shared.clear()
    for client, cluster in shared:
        _close(client, cluster)


def _close(client, cluster) -> None:
    """Close a kept client (and its cluster). The embedded cluster's workers are marked gone
    first, in every database it was registered in: a closing cluster can take seconds, and
    a process told to stop may not get them. A client of a scheduler elsewhere only stops
    marking its workers seen (`registry/heartbeat.py`)."""
    _let_go(client, gone=cluster is not None)
    try:
        client.close()
        if cluster is not None:
            cluster.close()
    except Exception as err:  # at exit: nothing left to do about it
        log.debug("deepx_flow: closing a cluster: %s", err)


def _let_go(client, gone: bool) -> None:
    from deepx_flow.registry import heartbeat
    try:
        heartbeat.release(client, gone=gone)
    except Exception as err:  # the database may be unusable; the cluster is closed anyway
        log.warning("deepx_flow: could not mark the closed cluster's workers gone: %s", err)


def chosen_address(client=None, scheduler=None) -> str | None:
    """The scheduler address a call names: `scheduler`, else DEEPX_SCHEDULER's (None for
    neither), after checking the `client=` and `scheduler=` arguments. Anything that cannot
    name a cluster is an InputError naming the argument and what it takes, before any
    cluster is started or contacted: a `client` that is not a `distributed.Client`, a
    `scheduler` that is not an address (a bad DEEPX_SCHEDULER is a SettingsError, as every
    setting); a closed client is a ClusterError."""
    if client is not None:
        from distributed import Client
        if not isinstance(client, Client):
            raise InputError(f"client must be a distributed.Client (or None), got "
                             f"{type(client).__name__} {shown(client)}")
        if client.status in ("closing", "closed"):
            raise ClusterError("the client given is closed: make a new distributed.Client, "
                               "or leave client=None to use the embedded cluster")
    if scheduler is None:
        return settings().scheduler_address  # checked as it is read
    problem = address_problem(scheduler)
    if problem:
        raise InputError(f"scheduler must be {Address.allowed} (or None), got "
                         f"{shown(scheduler)}: {problem}")
    return scheduler


@contextlib.contextmanager
def connect(client=None, scheduler: str | None = None):
    """Yield a `distributed.Client`: the one given, this process's one for `scheduler` (or
    `DEEPX_SCHEDULER`), the process's current client, or the embedded cluster's. The
    arguments are checked first (`chosen_address`)."""
    address = chosen_address(client, scheduler)
    if client is None and not address:
        client = current_client()
    yield client if client is not None else shared_client(address)
