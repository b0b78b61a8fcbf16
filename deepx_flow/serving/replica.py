"""Replicas of a model resident on the cluster's workers: each a Dask actor that loads the
model once on its worker and keeps it, so a batch reaches it directly, not through the
scheduler, and costs the model and a message: over a connection of the replica's own
where the cluster's connections are plain TCP (`channel.py`: an actor call took the GIL
from the gateway's event loop at each of its hops), else as an actor call.

A replica checks that the file it loads is the one the gateway checked (the same SHA-256):
a file changed or damaged between the two is refused, not served. Replicas are spread over
the workers (the GPU workers, where the cluster has any), one per worker before any worker
gets a second. A replica whose worker was
lost is placed again on a live worker when a batch finds it gone, and the batch runs there
(a model's answer does not depend on where it runs).
"""

from __future__ import annotations

import logging
import threading
import weakref

from deepx_flow.errors import DataError, DeepxError, ExecutionError
from deepx_flow.serving.channel import ChannelLost

log = logging.getLogger(__name__)


class Replica:
    """The actor: model `name` at `version` from `path`, whose digest must be `digest`."""

    def __init__(self, name: str, version: str, path: str, digest: str, batch_sizes=()):
        from deepx_flow.runtime.run import cluster_spec
        from deepx_flow.serving.model import load_model
        model = load_model(name, version, path, cluster_spec())
        if model.digest != digest:
            raise DataError(f"model {name!r} version {version}: {path} changed since the "
                            f"gateway checked it (its SHA-256 is {model.digest[:12]}..., "
                            f"not {digest[:12]}...)")
        from deepx_flow.serving.heap import retain_freed_memory
        retain_freed_memory()  # (each batch's buffers reused, not faulted in again)
        model.prepare(batch_sizes)
        self.model = model
        self._server = _batch_server(model)
        if self._server is not None:  # (stopped with the actor, if not told before)
            weakref.finalize(self, self._server.stop, True)

    def infer(self, arrays: dict, outputs=None) -> dict:
        return self.model.infer(arrays, outputs)

    def endpoint(self):
        """(host, port, token) of this replica's own connection for batches; None where
        its worker's connections are not plain TCP (batches then come as actor calls)."""
        if self._server is None:
            return None
        return (*self._server.address, self._server.token)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(connection=True)


def _batch_server(model):
    """A BatchServer for `model` on this worker's host, where its address is plain TCP."""
    from distributed import get_worker
    from distributed.comm.addressing import get_address_host, parse_address
    from distributed.core import Status

    from deepx_flow.serving.channel import BatchServer
    try:
        worker = get_worker()
    except ValueError:  # (not on a worker: a test's own process)
        return None
    if parse_address(worker.address)[0] != "tcp":
        return None
    return BatchServer(get_address_host(worker.address), model.infer,
                       alive=lambda: worker.status in (Status.running, Status.paused))


class Replicas:
    """`count` replicas of `model` (a ServedModel the gateway loaded and checked) on the
    workers of `client`: on the GPU workers among them, `gpus` (addresses), where there
    are any."""

    def __init__(self, client, model, count: int, gpus=(), batch_sizes=()):
        self.client, self.model, self.gpus = client, model, tuple(gpus)
        self.batch_sizes = tuple(batch_sizes)
        self._lock = threading.Lock()
        workers = _workers(client, self.gpus)
        if not workers:
            raise ExecutionError("the cluster has no workers to place the model's replicas on")
        self._placed = [self._place(workers[i % len(workers)]) for i in range(count)]

    def _place(self, worker: str):
        """(worker, actor future, actor, its BatchChannel or None) of a new replica on
        `worker`."""
        m = self.model
        future = self.client.submit(Replica, m.name, m.version, str(m.path), m.digest,
                                    self.batch_sizes, actor=True, workers=[worker],
                                    allow_other_workers=False, pure=False)
        try:
            # (the actor binds to the current client: the gateway's need not be the default)
            with self.client.as_current():
                actor = future.result()
        except DeepxError:
            raise
        except Exception as err:
            raise ExecutionError(f"model {m.name!r}: a replica could not start on {worker}: "
                                 f"{type(err).__name__}: {err}") from err
        return worker, future, actor, _channel(m.name, worker, actor)

    def run(self, replica: int, arrays: dict, outputs) -> dict:
        """Run a batch on replica `replica`; placed again once if its worker is gone."""
        with self._lock:
            placed = self._placed[replica]
        try:
            return _call(placed, arrays, outputs)
        except ChannelLost as err:
            lost = err
        except DeepxError:
            raise
        except Exception as err:  # its worker was lost (or the call could not reach it)
            lost = err
        live = _workers(self.client, self.gpus)
        if not live:
            raise ExecutionError(f"model {self.model.name!r}: its replica's worker is gone "
                                 f"({type(lost).__name__}: {lost}) and no worker is left")
        with self._lock:
            placed = self._placed[replica]
            _closed(placed)
            placed[1].release()  # (the old actor goes, where its worker still is)
            others = [w for w in live if w != placed[0]] or live
            self._placed[replica] = placed = self._place(others[replica % len(others)])
        return _call(placed, arrays, outputs)

    def workers(self) -> list[str]:
        with self._lock:
            return [p[0] for p in self._placed]

    def release(self) -> None:
        with self._lock:
            placed, self._placed = self._placed, []
        for p in placed:
            _closed(p)
            p[1].release()


def _channel(name: str, worker: str, actor):
    """A BatchChannel to `actor`'s own connection, or None (its worker's connections are
    not plain TCP, or it could not be reached: batches then go as actor calls)."""
    from deepx_flow.serving.channel import BatchChannel
    try:
        endpoint = actor.endpoint().result()
        return None if endpoint is None else BatchChannel(endpoint[:2], endpoint[2])
    except Exception as err:  # (said: the model still serves, as actor calls)
        log.warning("model %r: the replica on %s takes its batches as actor calls: its "
                    "connection could not be opened (%s: %s)", name, worker,
                    type(err).__name__, err)
        return None


def _call(placed, arrays: dict, outputs) -> dict:
    _, _, actor, channel = placed
    if channel is not None:
        return channel.run(arrays, outputs)
    return actor.infer(arrays, outputs).result()


def _closed(placed) -> None:
    """Close a replica's connection and stop its server (where its worker still is)."""
    _, _, actor, channel = placed
    if channel is not None:
        channel.close()
    try:
        actor.stop()  # (not waited for: a worker gone answers nothing)
    except Exception:
        pass


def _workers(client, gpus=()) -> list[str]:
    """The live workers replicas may go on: those of `gpus` alive, else every one."""
    from deepx_flow.registry.live import scheduler_workers
    live = sorted(scheduler_workers(client))
    return [w for w in live if w in gpus] or live
