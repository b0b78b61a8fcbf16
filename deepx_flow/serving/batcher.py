"""Dynamic batching, with Triton's knobs: requests to a model wait up to
`max_queue_delay_microseconds` for others to join them, up to `max_batch_size` rows (or
until a `preferred_batch_size` is reached), and run as one batch. A batch waits only while
other requests to the model are in the server: queued, on their way (being read and
checked: `arriving`), or in another replica's batch (whose clients, answered, send again).
So a lone request runs at once, and under load the delay gathers batches instead of each
replica taking whatever one request is there (which, at 64 clients, ran two thirds of the
batches with one row and starved the event loop that reads the requests).

One thread per replica takes requests from the model's queue, gathers a batch of those
that can go together (the same inputs, the same sizes past the batch axis, the same
outputs asked for), concatenates their inputs along the batch axis, runs the batch on its
replica, and hands each request the rows of every output that are its own. An output
whose first axis is not the batch's rows cannot be split so: every request of that batch
fails saying so, rather than getting rows that are not its own. A batch is padded with
rows of zeros to the next power of two (`padded`): the model is compiled for a few batch
sizes, not for each of the 64 a batch may have.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from deepx_flow.errors import ExecutionError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Arrival:
    """A request being read for `batcher`, counted among those arriving until queued."""

    batcher: object
    counted: bool = True


@dataclass
class Request:
    arrays: dict
    outputs: tuple | None
    rows: int
    future: Future = field(default_factory=Future)
    queued_ns: int = field(default_factory=time.perf_counter_ns)

    def key(self) -> tuple:
        """What a request must share with others to join their batch."""
        return (tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in self.arrays.items())),
                self.outputs)


class Batcher:
    """Batches for one model: `run(replica, arrays, outputs)` computes a batch on replica
    `replica` (0 to `replicas` - 1); `done(rows, ns, queued, succeeded)` is told of each
    batch that ran (its rows, nanoseconds, each request's nanoseconds in the queue), for
    statistics."""

    def __init__(self, name: str, run, replicas: int, max_batch_size: int,
                 max_delay_us: int, preferred=(), done=None):
        self.name, self.run = name, run
        self.max_batch_size, self.delay_s = max_batch_size, max_delay_us / 1e6
        self.preferred = set(preferred)
        self.done = done
        self._queue: queue.Queue = queue.Queue()
        # Counted as the lengths of deques, whose appends and pops are atomic: a lock here,
        # taken by the event loop for every request and by the replicas for every batch,
        # cost the event loop 13 us a request in waits behind replicas holding the GIL.
        self._arriving = collections.deque()  # requests being read and checked, not queued
        self._pending = collections.deque()  # requests queued or in a batch, not answered
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._serve, args=(i,), daemon=True,
                                          name=f"deepx-batcher-{name}-{i}")
                         for i in range(replicas)]
        for t in self._threads:
            t.start()

    @contextlib.contextmanager
    def arriving(self):
        """Around reading and checking a request: a batch waits for others only while
        some are queued or on their way, never for requests that are not coming. Yields
        the request's Arrival, which `submit` takes: a request is counted once, arriving
        or pending, never both (a lone request counted twice waited the whole delay)."""
        arrival = Arrival(self)
        self._arriving.append(None)
        try:
            yield arrival
        finally:
            if arrival.counted:
                arrival.counted = False
                self._arriving.pop()

    def submit(self, arrays: dict, outputs, rows: int, arrival=None) -> Future:
        """Queue a request of `rows` rows: a Future of its outputs (name -> array).
        `arrival`: the request's, when it was read inside `arriving()`."""
        request = Request(arrays, tuple(outputs) if outputs else None, rows)
        if self._stopped.is_set():
            request.future.set_exception(ExecutionError(f"model {self.name!r} was unloaded"))
            return request.future
        self._pending.append(None)
        if arrival is not None and arrival.batcher is self and arrival.counted:
            arrival.counted = False
            self._arriving.pop()
        self._queue.put(request)
        return request.future

    def stop(self) -> None:
        """Stop taking requests; those queued run first (a graceful stop answers them)."""
        self._stopped.set()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(60)

    def _serve(self, replica: int) -> None:
        carried = None
        while True:
            first = carried if carried is not None else self._queue.get()
            carried = None
            if first is None:
                return
            if not self._started(first):
                continue
            batch, rows = [first], first.rows
            deadline = time.monotonic() + self.delay_s
            while rows < self.max_batch_size and rows not in self.preferred:
                if self._queue.empty() and \
                        len(self._arriving) + len(self._pending) <= len(batch):
                    break  # no other request in the server: waiting would only add delay
                wait = deadline - time.monotonic()
                try:
                    nxt = self._queue.get(timeout=wait) if wait > 0 else \
                        self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt.key() != first.key() or \
                        rows + nxt.rows > self.max_batch_size:
                    carried = nxt  # the first of the next batch (None: stop after this)
                    break
                if self._started(nxt):
                    batch.append(nxt)
                    rows += nxt.rows
            try:
                self._run(replica, batch, rows)
            except Exception as err:  # a bug: said, and the model keeps its replica
                log.exception("model %r: replica %d failed a batch", self.name, replica)
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(ExecutionError(
                            f"model {self.name!r}: the batch failed: "
                            f"{type(err).__name__}: {err}"))
            if carried is None and self._stopped.is_set() and self._queue.empty():
                return

    def _started(self, request: Request) -> bool:
        """Mark a request as running (it can no longer be cancelled); False, and no
        longer pending, for one its caller cancelled while it was queued (a gRPC deadline,
        a client gone)."""
        if request.future.set_running_or_notify_cancel():
            return True
        self._pending.pop()
        return False

    def _run(self, replica: int, batch: list[Request], rows: int) -> None:
        try:
            self._compute(replica, batch, rows)
        finally:
            for _ in batch:
                self._pending.pop()

    def _compute(self, replica: int, batch: list[Request], rows: int) -> None:
        began = time.perf_counter_ns()
        queued = [began - r.queued_ns for r in batch]
        size = self.padded(rows)
        split = len(batch) > 1 or size != rows
        try:
            arrays = batch[0].arrays if not split else {
                name: np.concatenate([r.arrays[name] for r in batch] + ([np.zeros(
                    (size - rows,) + batch[0].arrays[name].shape[1:],
                    batch[0].arrays[name].dtype)] if size > rows else []))
                for name in batch[0].arrays}
            outputs = self.run(replica, arrays, batch[0].outputs)
            if split:
                for name, out in outputs.items():
                    if out.ndim == 0 or out.shape[0] != size:
                        raise ExecutionError(
                            f"model {self.name!r}: output {name!r} has shape "
                            f"{list(out.shape)} for a batch of {size} rows, so it cannot be "
                            f"split into each request's rows; serve it without "
                            f"dynamic_batching")
        except BaseException as err:
            for r in batch:
                r.future.set_exception(err)
            if self.done is not None:
                self.done(rows, time.perf_counter_ns() - began, queued, False)
            return
        if self.done is not None:
            self.done(rows, time.perf_counter_ns() - began, queued, True)
        at = 0
        for r in batch:
            r.future.set_result({name: out[at:at + r.rows] if split else out
                                 for name, out in outputs.items()})
            at += r.rows

    def padded(self, rows: int) -> int:
        """The rows a batch of `rows` runs as: with batching, the next power of two (at
        most max_batch_size), so the model is built and compiled for a few sizes, not for
        every size a batch happens to have; the added rows are zeros, whose answers are
        dropped (batching already takes each row to be computed alone)."""
        if self.max_batch_size <= 0 or rows >= self.max_batch_size:
            return rows
        return next(size for size in batch_sizes(self.max_batch_size) if size >= rows)


def batch_sizes(max_batch_size: int) -> list[int]:
    """Every size a padded batch runs as (`Batcher.padded`): the powers of two below
    `max_batch_size`, and it. A model is prepared for each when it loads."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    return sizes + ([max_batch_size] if max_batch_size > 1 else [])
