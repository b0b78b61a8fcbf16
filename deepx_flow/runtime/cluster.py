"""Finding a cluster to run on: a given client, a scheduler address, or an embedded one.

With no client and no address, `dx.run` starts an embedded `distributed.LocalCluster` sized to
this machine (a `dask_cuda.LocalCUDACluster`, one worker per GPU, when dask-cuda and GPUs are
there) and closes it afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging

from deepx_flow.config import settings
from deepx_flow.errors import ClusterError
from deepx_flow.registry.cluster import local_layout


def _gpu_count() -> int:
    if importlib.util.find_spec("dask_cuda") is None or importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def start_embedded_cluster(**kwargs):
    """A local cluster for this machine; keyword arguments override the defaults."""
    if _gpu_count() and not kwargs.pop("cpu", False):
        from dask_cuda import LocalCUDACluster
        return LocalCUDACluster(dashboard_address=kwargs.pop("dashboard_address", "127.0.0.1:0"),
                                **kwargs)
    from distributed import LocalCluster
    n_workers, threads = local_layout()
    options = dict(n_workers=n_workers, threads_per_worker=threads, processes=True,
                   dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)
    options.update(kwargs)
    return LocalCluster(**options)


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


@contextlib.contextmanager
def connect(client=None, scheduler: str | None = None):
    """Yield a `distributed.Client`: the one given, one for `scheduler` (or
    `DEEPX_SCHEDULER`), the process's current client, or an embedded cluster's."""
    from distributed import Client
    address = scheduler or settings().scheduler_address
    if client is None and not address:
        client = current_client()
    if client is not None:
        yield client
        return
    if address:
        with open_client(address) as remote:
            yield remote
        return
    with start_embedded_cluster() as cluster, Client(cluster) as local:
        yield local
