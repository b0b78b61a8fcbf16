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

import asyncio
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
    are any. A batch goes over the replica's own connection from the gateway's event loop
    (`run_async`), or as an actor call (`run`, for a caller with no event loop)."""

    def __init__(self, client, model, count: int, gpus=(), batch_sizes=()):
        self.client, self.model, self.gpus = client, model, tuple(gpus)
        self.batch_sizes = tuple(batch_sizes)
        # `_lock` guards the placements and channels and is held only to read or swap
        # them (the event loop takes it); placing a replica again, which waits on the
        # cluster for seconds, holds that replica's own lock instead, in a thread
        self._lock = threading.Lock()
        self._placing = [threading.Lock() for _ in range(count)]
        self._channels: dict = {}  # replica -> (its placement, its BatchChannel or None)
        workers = _workers(client, self.gpus)
        if not workers:
            raise ExecutionError("the cluster has no workers to place the model's replicas on")
        self._placed = [self._place(workers[i % len(workers)]) for i in range(count)]

    def _place(self, worker: str):
        """(worker, actor future, actor, (host, port, token) of its connection or None) of
        a new replica on `worker`."""
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
        return worker, future, actor, _endpoint(m.name, worker, actor)

    def run(self, replica: int, arrays: dict, outputs) -> dict:
        """Run a batch on replica `replica` as an actor call; placed again once if its
        worker is gone."""
        placed = self._current(replica)
        try:
            return _actor_call(placed, arrays, outputs)
        except DeepxError:
            raise
        except Exception as err:  # its worker was lost (or the call could not reach it)
            lost = err
        return _actor_call(self._placed_again(replica, placed, lost), arrays, outputs)

    async def run_async(self, replica: int, arrays: dict, outputs) -> dict:
        """Run a batch on replica `replica` over its connection, from this event loop (as an
        actor call, in a thread, where it has none); placed again once if its worker is
        gone (in a thread: placing waits on the cluster)."""
        placed = self._current(replica)
        try:
            return await self._sent(replica, placed, arrays, outputs)
        except ChannelLost as err:
            lost = err
        except DeepxError:
            raise
        except Exception as err:  # its worker was lost (or the call could not reach it)
            lost = err
        placed = await asyncio.to_thread(self._placed_again, replica, placed, lost)
        return await self._sent(replica, placed, arrays, outputs)

    def _current(self, replica: int):
        with self._lock:
            if not self._placed:
                raise self._unloaded()
            return self._placed[replica]

    def _unloaded(self) -> ExecutionError:
        return ExecutionError(f"model {self.model.name!r} was unloaded")

    async def _sent(self, replica: int, placed, arrays: dict, outputs) -> dict:
        channel = await self._channel(replica, placed)
        if channel is None:
            return await asyncio.to_thread(_actor_call, placed, arrays, outputs)
        return await channel.run(arrays, outputs)

    async def _channel(self, replica: int, placed):
        """The connection to replica `replica` as `placed`, opened on this loop at its
        first batch; None where its batches go as actor calls (its worker's connections
        are not plain TCP, or it could not be reached: said)."""
        from deepx_flow.serving.channel import BatchChannel
        loop = asyncio.get_running_loop()
        with self._lock:
            held = self._channels.get(replica)
        if held is not None and held[0] is placed:
            channel = held[1]
            if channel is None or (channel.loop is loop and not channel.broken):
                return channel
            if channel.broken:  # (its server takes no other: the replica is placed again)
                raise ChannelLost("the connection to the replica broke in an earlier batch")
        if held is not None and held[1] is not None:
            held[1].close()  # (another loop's, or a placement's before)
        channel, endpoint = None, placed[3]
        if endpoint is not None:
            try:
                channel = await BatchChannel.open(endpoint[:2], endpoint[2])
            except (OSError, asyncio.TimeoutError) as err:
                log.warning("model %r: the replica on %s takes its batches as actor calls: "
                            "its connection could not be opened (%s: %s)", self.model.name,
                            placed[0], type(err).__name__, err)
        with self._lock:
            kept = bool(self._placed) and self._placed[replica] is placed
            if kept:  # (not placed again, nor released, meanwhile)
                self._channels[replica] = (placed, channel)
        if not kept:
            if channel is not None:
                channel.close()
            raise ChannelLost("the replica was placed again while its connection opened")
        return channel

    def _placed_again(self, replica: int, placed, lost: Exception):
        """Replica `replica`, whose placement `placed` failed a batch with `lost`, on a live
        worker (another, where there is one); the old actor released and its connection
        closed."""
        with self._placing[replica]:  # (one placement of it at a time)
            with self._lock:
                current = self._placed[replica] if self._placed else None
                if current is not placed:
                    if current is None:
                        raise self._unloaded()
                    return current  # (placed again already, by another batch)
                channel = self._channels.pop(replica, None)
            live = _workers(self.client, self.gpus)
            if not live:
                raise ExecutionError(f"model {self.model.name!r}: its replica's worker is "
                                     f"gone ({type(lost).__name__}: {lost}) and no worker "
                                     f"is left")
            _closed(placed, channel)
            placed[1].release()  # (the old actor goes, where its worker still is)
            others = [w for w in live if w != placed[0]] or live
            new = self._place(others[replica % len(others)])
            with self._lock:
                released = not self._placed
                if not released:
                    self._placed[replica] = new
            if released:  # (unloaded meanwhile: the new one goes too)
                _closed(new)
                new[1].release()
                raise self._unloaded()
            return new

    def workers(self) -> list[str]:
        with self._lock:
            return [p[0] for p in self._placed]

    def release(self) -> None:
        with self._lock:
            placed, self._placed = self._placed, []
            channels, self._channels = self._channels, {}
        for i, p in enumerate(placed):
            _closed(p, channels.get(i))
            p[1].release()


def _endpoint(name: str, worker: str, actor):
    """(host, port, token) of `actor`'s own connection, or None (its worker's connections
    are not plain TCP, or it could not say: batches then go as actor calls)."""
    try:
        return actor.endpoint().result()
    except Exception as err:  # (said: the model still serves, as actor calls)
        log.warning("model %r: the replica on %s takes its batches as actor calls: its "
                    "connection's address could not be had (%s: %s)", name, worker,
                    type(err).__name__, err)
        return None


def _actor_call(placed, arrays: dict, outputs) -> dict:
    return placed[2].infer(arrays, outputs).result()


def _closed(placed, channel=None) -> None:
    """Close a replica's connection (`channel`: (placement, BatchChannel or None)) and stop
    its server (where its worker still is)."""
    if channel is not None and channel[1] is not None:
        channel[1].close()
    try:
        placed[2].stop()  # (not waited for: a worker gone answers nothing)
    except Exception:
        pass


def _workers(client, gpus=()) -> list[str]:
    """The live workers replicas may go on: those of `gpus` alive, else every one."""
    from deepx_flow.registry.live import scheduler_workers
    live = sorted(scheduler_workers(client))
    return [w for w in live if w in gpus] or live
