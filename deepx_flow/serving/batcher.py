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
rows of zeros to the next of a few sizes (`padded`): the model is compiled for those, not
for each of the 64 a batch may have.

A batcher `on_loop` has no thread: the event loop that reads the requests runs their
batches itself, each of the requests queued when it comes to it (`repository.py` says
which models: those whose batches are quicker than handing the GIL to and from a thread).
A batcher with `run_async` (replicas on the workers, `replica.py`) has none either: the
loop sends each replica a batch of the requests queued when it comes to it, and the next
when that one is answered; while every replica is busy, requests queue and the next
batches are larger. (A thread per replica, waiting on its connection, took the GIL back
from the loop at each call: every request read was slower.)
Requests awaited on a loop get asyncio Futures, set there, a batch's in one hop.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from deepx_flow.errors import ExecutionError

log = logging.getLogger(__name__)

STOP_WAIT_S = 60.0  # how long stopping waits for the batches a loop still sends


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
    future: object = field(default_factory=Future)  # (asyncio's, on `loop`, if any)
    loop: object = None  # the event loop awaiting `future`, if any (Batcher.submit)
    queued_ns: int = field(default_factory=time.perf_counter_ns)

    def key(self) -> tuple:
        """What a request must share with others to join their batch."""
        return (tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in self.arrays.items())),
                self.outputs)


class Batcher:
    """Batches for one model: `run(replica, arrays, outputs)` computes a batch on replica
    `replica` (0 to `replicas` - 1); `done(rows, ns, queued, succeeded)` is told of each
    batch that ran (its rows, nanoseconds, each request's nanoseconds in the queue), for
    statistics. `run_async`: a coroutine function like `run`, which the event loop of the
    requests awaits instead (`run` is then for requests from no loop)."""

    def __init__(self, name: str, run, replicas: int, max_batch_size: int,
                 max_delay_us: int, preferred=(), done=None, on_loop: bool = False,
                 run_async=None):
        self.name, self.run, self.run_async = name, run, run_async
        self.on_loop = on_loop or run_async is not None
        self.max_batch_size, self.delay_s = max_batch_size, max_delay_us / 1e6
        self.preferred = set(preferred)
        self.done = done
        self._sizes = batch_sizes(max_batch_size)
        # Queued requests, and the replicas waiting for them: an idle replica for a first
        # request (`_work`), the one gathering a batch for it to fill (`_filled`). A
        # request wakes a replica only when that replica has something to do: a replica
        # woken by every request (as queue.Queue's get does) took the GIL from the event
        # loop twice a request, and under load the loop then spent twice as long on each.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._filled = threading.Condition(self._lock)
        self._queue: collections.deque = collections.deque()
        self._queued_rows = 0
        self._idle = 0  # replicas waiting for a first request
        self._gathering = None  # [rows, requests, key] of the batch gathered, if any
        # Counted as the lengths of deques, whose appends and pops are atomic, so that
        # `arriving` and a replica's last count take no lock.
        self._arriving = collections.deque()  # requests being read and checked, not queued
        self._pending = collections.deque()  # requests queued or in a batch, not answered
        self._stopped = threading.Event()
        self._draining = False  # (on_loop) a drain is scheduled on a loop
        self._loop = None  # (on_loop) the loop of the requests, once one came
        self._free = list(range(replicas))[::-1]  # (run_async) replicas with no batch
        self._sending: set = set()  # (run_async) the tasks of the batches sent
        self._threads = [] if self.on_loop else [
            threading.Thread(target=self._serve, args=(i,), daemon=True,
                             name=f"deepx-batcher-{name}-{i}") for i in range(replicas)]
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
                if not self._arriving and self._gathering is not None:
                    with self._lock:  # (the batch may have been waiting for this one)
                        self._filled.notify()

    def submit(self, arrays: dict, outputs, rows: int, arrival=None, loop=None):
        """Queue a request of `rows` rows: a Future of its outputs (name -> array).
        `arrival`: the request's, when it was read inside `arriving()`. `loop`: the
        running event loop of the caller (called on its thread), which then gets an
        asyncio Future, set on that loop: one hop for a batch instead of one a request
        (and a concurrent Future, with the lock it makes, cost the loop 5 us a request)."""
        request = Request(arrays, tuple(outputs) if outputs else None, rows,
                          future=Future() if loop is None else loop.create_future(),
                          loop=loop)
        if arrival is not None and arrival.batcher is self and arrival.counted:
            arrival.counted = False
            self._arriving.pop()
        if self.on_loop:
            return self._submitted_on_loop(request)
        with self._lock:  # (stopped is read under the lock stop() sets it under)
            if self._stopped.is_set():
                return _unloaded(self.name, request)
            self._pending.append(None)
            self._queue.append(request)
            self._queued_rows += rows
            gathering = self._gathering
            if gathering is not None:
                if self._queued_rows + gathering[0] >= self.max_batch_size or \
                        self._queued_rows + gathering[0] in self.preferred or \
                        self._nothing_coming(gathering[1] + len(self._queue)) or \
                        self._queue[0] is request and (request.key() != gathering[2] or
                                                       gathering[0] + rows >
                                                       self.max_batch_size):
                    self._filled.notify()  # (the last: it cannot join; the batch goes)
            elif self._idle:
                self._work.notify()
        return request.future

    def _submitted_on_loop(self, request: Request):
        """Queue `request` for a batch computed on its loop: the requests queued when the
        loop comes to it (those read in the same turn of the loop, under load tens of
        them) run as one batch. A request from no loop (a caller in a thread) runs here,
        alone."""
        with self._lock:
            if self._stopped.is_set():
                return _unloaded(self.name, request)
            self._pending.append(None)
            if request.loop is not None:
                self._loop = request.loop
                self._queue.append(request)
                self._queued_rows += request.rows
                scheduled, self._draining = self._draining, True
        if request.loop is None:
            if self._started(request):
                self._run_answered(0, [request], request.rows)
            return request.future
        if not scheduled:  # (threadsafe: a caller may queue from another thread)
            request.loop.call_soon_threadsafe(self._drain, request.loop)
        return request.future

    def _drain(self, loop) -> None:
        """Run the next batch of the queue on `loop` (this thread's), and come back for
        the rest; with run_async, send the next batches to the replicas that have none."""
        if self.run_async is not None:
            self._send(loop)
            return
        with self._lock:
            self._draining = False
            batch, _ = self._head() if self._queue else ([], 0)
        batch = [r for r in batch if self._started(r)]
        if batch:
            self._run_answered(0, batch, sum(r.rows for r in batch), loop)
        with self._lock:
            again = bool(self._queue) and not self._draining
            self._draining = self._draining or again
        if again:
            loop.call_soon(self._drain, loop)

    def _send(self, loop) -> None:
        """Give each replica with no batch the next batch of the queue, as a task of
        `loop` (held here: the loop keeps only weak references to its tasks)."""
        with self._lock:
            self._draining = False
            taken = []
            while self._queue and self._free:
                taken.append((self._free.pop(), self._head()[0]))
        for replica, batch in taken:
            batch = [r for r in batch if self._started(r)]
            if batch:
                task = loop.create_task(self._sent(replica, batch,
                                                   sum(r.rows for r in batch), loop))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
            else:
                self._freed(replica, loop)

    async def _sent(self, replica: int, batch: list, rows: int, loop) -> None:
        """A batch sent to `replica` and awaited: `_run_answered`'s, on the loop."""
        try:
            try:
                await self._compute_async(replica, batch, rows, loop)
            finally:
                for _ in batch:
                    self._pending.pop()
        except Exception as err:
            self._last_resort(replica, batch, err, loop)
        finally:
            self._freed(replica, loop)

    def _freed(self, replica: int, loop) -> None:
        """`replica` has no batch now: the next goes to it, where requests are queued."""
        with self._lock:
            self._free.append(replica)
            again = bool(self._queue) and not self._draining
            self._draining = self._draining or again
        if again:
            loop.call_soon(self._drain, loop)

    def _nothing_coming(self, held: int) -> bool:
        """Whether no request but the `held` ones (queued, or in the batch gathered) is in
        the server: none arriving, none in another replica's batch (whose clients,
        answered, send again). Then waiting would only add delay."""
        return not self._arriving and len(self._pending) <= held

    def stop(self) -> None:
        """Stop taking requests; those queued run first (a graceful stop answers them):
        with run_async, on their loop where it still runs (this waits for them, up to
        STOP_WAIT_S), else here."""
        with self._lock:
            self._stopped.set()
        loop, deadline = self._loop, time.monotonic() + STOP_WAIT_S
        while self.run_async is not None and self._pending and loop is not None and \
                loop.is_running() and not _runs(loop) and time.monotonic() < deadline:
            time.sleep(0.002)
        while self.on_loop:  # (what their loop did not come to before it ended)
            with self._lock:
                if not self._queue:
                    break
                batch, _ = self._head()
            batch = [r for r in batch if self._started(r)]
            if batch:
                self._run_answered(0, batch, sum(r.rows for r in batch))
        with self._lock:
            self._work.notify_all()
            self._filled.notify_all()
        for t in self._threads:
            t.join(60)

    def _serve(self, replica: int) -> None:
        while True:
            batch, rows = self._gathered()
            if batch is None:
                return
            if batch:
                self._run_answered(replica, batch, rows)

    def _run_answered(self, replica: int, batch: list, rows: int, loop=None) -> None:
        """`_run`, every request of the batch answered even where a bug stops it: said,
        and the model keeps its replica."""
        try:
            self._run(replica, batch, rows, loop)
        except Exception as err:
            self._last_resort(replica, batch, err, loop)

    def _last_resort(self, replica: int, batch: list, err: Exception, loop) -> None:
        log.exception("model %r: replica %d failed a batch", self.name, replica,
                      exc_info=err)
        self._settle([(r, False, ExecutionError(
            f"model {self.name!r}: the batch failed: {type(err).__name__}: {err}"))
            for r in batch if not r.future.done()], loop)

    def _gathered(self) -> tuple[list | None, int]:
        """The next batch and its rows: the requests at the head of the queue that go
        together (the same key, within max_batch_size), gathered for up to the queue
        delay while others are on their way. (None, 0) once stopped with nothing queued;
        ([], 0) when every request taken had been cancelled."""
        with self._lock:
            while not self._queue or self._gathering is not None:
                if self._stopped.is_set() and not self._queue:
                    return None, 0
                self._idle += 1
                self._work.wait()
                self._idle -= 1
            batch, rows = self._head()
            key = batch[0].key()
            self._gathering = gathering = [rows, len(batch), key]
            deadline = time.monotonic() + self.delay_s
            try:
                while True:
                    rows = self._joined(batch, rows)
                    gathering[:] = [rows, len(batch), key]
                    wait = deadline - time.monotonic()
                    if self._queue or rows >= self.max_batch_size or rows in self.preferred \
                            or wait <= 0 or self._stopped.is_set() or \
                            self._nothing_coming(len(batch)):
                        break
                    self._filled.wait(wait)
            finally:
                self._gathering = None
            if self._stopped.is_set():
                self._work.notify_all()  # (each to run what is left, or to end)
            elif self._queue:
                self._work.notify()  # (the next batch's first is there)
        started = [r for r in batch if self._started(r)]
        return started, sum(r.rows for r in started)

    def _head(self) -> tuple[list, int]:
        """The requests at the head of the queue that go together, and their rows; under
        the lock, with a request queued."""
        first = self._take()
        batch = [first]
        return batch, self._joined(batch, first.rows)

    def _joined(self, batch: list, rows: int) -> int:
        """Take the requests at the head of the queue that can join `batch` (of `rows`
        rows): the same key, within max_batch_size. Its rows after."""
        key = batch[0].key()
        while self._queue and rows < self.max_batch_size and rows not in self.preferred:
            nxt = self._queue[0]
            if nxt.key() != key or rows + nxt.rows > self.max_batch_size:
                break  # the first of the next batch
            batch.append(self._take())
            rows += nxt.rows
        return rows

    def _take(self) -> Request:
        request = self._queue.popleft()
        self._queued_rows -= request.rows
        return request

    def _started(self, request: Request) -> bool:
        """Mark a request as running (a concurrent Future can then no longer be
        cancelled); False, and no longer pending, for one its caller cancelled while it
        was queued (a gRPC deadline, a client gone)."""
        if request.future.cancelled() if request.loop is not None else \
                not request.future.set_running_or_notify_cancel():
            self._pending.pop()
            return False
        return True

    def _run(self, replica: int, batch: list[Request], rows: int, loop=None) -> None:
        try:
            self._compute(replica, batch, rows, loop)
        finally:
            for _ in batch:
                self._pending.pop()

    def _compute(self, replica: int, batch: list[Request], rows: int, loop=None) -> None:
        began = time.perf_counter_ns()
        try:
            arrays, size, split = self._batched(batch, rows)
            outputs = self._split_checked(self.run(replica, arrays, batch[0].outputs),
                                          size, split)
        except BaseException as err:
            self._ended(batch, rows, began, False, err, False, loop)
            if not isinstance(err, Exception):
                raise  # (an interrupt, a stop: said to its requests, and not swallowed)
            return
        self._ended(batch, rows, began, True, outputs, split, loop)

    async def _compute_async(self, replica: int, batch: list[Request], rows: int,
                             loop) -> None:
        """`_compute`, the batch awaited from `run_async`."""
        began = time.perf_counter_ns()
        try:
            arrays, size, split = self._batched(batch, rows)
            outputs = self._split_checked(
                await self.run_async(replica, arrays, batch[0].outputs), size, split)
        except BaseException as err:
            self._ended(batch, rows, began, False, err, False, loop)
            if not isinstance(err, Exception):
                raise  # (a cancelled task: said to its requests, and not swallowed)
            return
        self._ended(batch, rows, began, True, outputs, split, loop)

    def _batched(self, batch: list[Request], rows: int) -> tuple[dict, int, bool]:
        """The batch's arrays (its requests' rows, padded with zeros to `padded(rows)`),
        that size, and whether the outputs are split among requests."""
        size = self.padded(rows)
        split = len(batch) > 1 or size != rows
        arrays = batch[0].arrays if not split else {
            name: np.concatenate([r.arrays[name] for r in batch] + ([np.zeros(
                (size - rows,) + batch[0].arrays[name].shape[1:],
                batch[0].arrays[name].dtype)] if size > rows else []))
            for name in batch[0].arrays}
        return arrays, size, split

    def _split_checked(self, outputs: dict, size: int, split: bool) -> dict:
        if split:
            for name, out in outputs.items():
                if out.ndim == 0 or out.shape[0] != size:
                    raise ExecutionError(
                        f"model {self.name!r}: output {name!r} has shape "
                        f"{list(out.shape)} for a batch of {size} rows, so it cannot be "
                        f"split into each request's rows; serve it without "
                        f"dynamic_batching")
        return outputs

    def _ended(self, batch: list[Request], rows: int, began: int, succeeded: bool, value,
               split: bool, loop) -> None:
        """Count the batch (begun at `began`) and answer its requests: each its rows of
        the outputs `value`, or the error `value`."""
        queued = [began - r.queued_ns for r in batch]
        if self.done is not None:
            self.done(rows, time.perf_counter_ns() - began, queued, succeeded)
        if not succeeded:
            self._settle([(r, False, value) for r in batch], loop)
            return
        outcomes, at = [], 0
        for r in batch:
            outcomes.append((r, True, {name: out[at:at + r.rows] if split else out
                                       for name, out in value.items()}))
            at += r.rows
        self._settle(outcomes, loop)

    @staticmethod
    def _settle(outcomes: list, here=None) -> None:
        """Set each request's outcome, (request, succeeded, outputs or error): on the
        event loop that awaits it, in one call for all of that loop's (a call a request
        took the GIL from that loop once a request), or else here. `here`: the loop this
        thread runs, if any (its requests' outcomes are set at once)."""
        on_loops: dict = {}
        for outcome in outcomes:
            loop = outcome[0].loop
            if loop is None or loop is here:
                _set(outcome)
            else:
                on_loops.setdefault(loop, []).append(outcome)
        for loop, settled in on_loops.items():
            try:
                loop.call_soon_threadsafe(_set_all, settled)
            except RuntimeError:  # the loop is closed: set here, each (a future's
                for outcome in settled:  # callbacks cannot be scheduled on it: said,
                    try:  # and the others still set)
                        _set(outcome)
                    except RuntimeError:
                        pass

    def padded(self, rows: int) -> int:
        """The rows a batch of `rows` runs as: with batching, the next of `batch_sizes`,
        so the model is built and compiled for a few sizes, not for every size a batch
        happens to have; the added rows are zeros, whose answers are dropped (batching
        already takes each row to be computed alone)."""
        if self.max_batch_size <= 0 or rows >= self.max_batch_size:
            return rows
        return self._sizes[bisect.bisect_left(self._sizes, rows)]


def _runs(loop) -> bool:
    """Whether this thread runs `loop`."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _set(outcome: tuple) -> None:
    request, succeeded, value = outcome
    if request.future.done():  # (failed by the last resort, `_run_answered`; cancelled)
        return
    if succeeded:
        request.future.set_result(value)
    else:
        request.future.set_exception(value)


def _set_all(outcomes: list) -> None:
    for outcome in outcomes:
        _set(outcome)


def _unloaded(name: str, request: Request):
    request.future.set_exception(ExecutionError(f"model {name!r} was unloaded"))
    return request.future


def batch_sizes(max_batch_size: int) -> list[int]:
    """Every size a padded batch runs as (`Batcher.padded`): 1, 2, 4, 8, every multiple
    of 8 up to 64, then the powers of two below `max_batch_size`, and it. A model is
    prepared for each when it loads, and keeps them all (a few more than 11 even for
    thousands of rows: `model.BUILT_SHAPES`). (Powers of two all the way padded the 18
    rows of a typical batch at 64 clients to 32, nearly twice the work; multiples of 8 pad
    at most 7 rows where batches are small, and above 64 rows a batch is work enough.)"""
    sizes = [1]
    while sizes[-1] < min(8, max_batch_size):
        sizes.append(min(sizes[-1] * 2, max_batch_size))
    while sizes[-1] < min(64, max_batch_size):
        sizes.append(min(sizes[-1] + 8, max_batch_size))
    while sizes[-1] * 2 < max_batch_size:
        sizes.append(sizes[-1] * 2)
    return sizes + ([max_batch_size] if max_batch_size > sizes[-1] else [])
