"""Reading a Dask scheduler from the dashboard without holding up its pages.

One `SchedulerWatch` per scheduler address per server process (`watch(address)`). It holds
one `distributed.Client` (never made the default client, so it changes nothing else in the
process), used by one background thread: pages ask for a reading (`request`, which returns
at once) and show the latest one (`latest`), so the Bokeh event loop never waits on the
network. Requests while a read is under way share it, so any number of browser sessions
cost one read at a time. A scheduler that does not answer within `timeout` seconds gives a
reading that says why; the client is dropped and the next request connects again. A page
opening waits `FIRST_WAIT_S` at most for a reading (a live scheduler answers in a few
milliseconds), and not at all while the scheduler's last answer was a failure: it shows that
and asks again behind.

It uses the scheduler's public API only: `identity(n_workers=-1)`, all workers with their
metrics and services (as `registry.live.scheduler_workers` does).
"""

from __future__ import annotations

import inspect
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

TIMEOUT_S = 2.0
FRESH_S = 3.0  # a reading younger than this is shown as it is when a page opens
FIRST_WAIT_S = 0.5  # what a page opening waits at most for a new reading


@dataclass(frozen=True)
class Reading:
    """What the scheduler said at time `at`: its `identity`, or the `error` that stopped
    the read (`at` is 0 before the first read)."""

    identity: dict | None
    error: str | None
    at: float


class SchedulerWatch:
    def __init__(self, address: str, timeout: float = TIMEOUT_S):
        self.address, self.timeout = address, timeout
        self._lock = threading.Lock()
        self._latest = Reading(None, "not read yet", 0.0)
        self._pending: Future | None = None
        self._client = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="deepx-scheduler-watch")

    def latest(self) -> Reading:
        with self._lock:
            return self._latest

    def request(self) -> Future:
        """Start a read unless one is under way; the future gives its Reading."""
        with self._lock:
            if self._pending is None or self._pending.done():
                self._pending = self._pool.submit(self._read)
            return self._pending

    def current(self, wait: float = FIRST_WAIT_S, fresh: float = FRESH_S) -> Reading:
        """The latest reading if it is younger than `fresh` seconds or was a failure (a new
        read starts behind it), else a new one, waiting for it at most `wait` seconds (then
        the latest, however old)."""
        latest = self.latest()
        if time.time() - latest.at < fresh:
            return latest
        if latest.at and latest.error:  # it did not answer last time: no page waits on it
            self.request()
            return latest
        try:
            return self.request().result(timeout=wait)
        except FutureTimeout:
            return self.latest()

    def _read(self) -> Reading:
        try:
            identity = self._identity()
            reading = Reading(identity, None, time.time())
        except Exception as err:  # unreachable, timed out, gone: say so, connect again later
            self._drop_client()
            reading = Reading(None, _reason(err, self.address, self.timeout), time.time())
        with self._lock:
            self._latest = reading
        return reading

    def _identity(self) -> dict:
        from distributed import Client
        if self._client is None:
            self._client = Client(self.address, set_as_default=False, timeout=self.timeout)
        client = self._client
        # Older distributed has no n_workers (and returns every worker).
        kwargs = {"n_workers": -1} if _takes_n_workers(client) else {}
        return client.sync(client.scheduler.identity, **kwargs,
                           callback_timeout=self.timeout)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close(timeout=self.timeout)
            except Exception:  # closing a client whose scheduler is gone may fail too
                pass


def _takes_n_workers(client) -> bool:
    return "n_workers" in inspect.signature(client.scheduler_info).parameters


def _reason(err: Exception, address: str, timeout: float) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    what = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return f"the Dask scheduler at {address} could not be reached within {timeout:g} s ({what})"


_WATCHES: dict[str, SchedulerWatch] = {}
_WATCHES_LOCK = threading.Lock()


def watch(address: str) -> SchedulerWatch:
    """The process's one watch on the scheduler at `address`."""
    with _WATCHES_LOCK:
        if address not in _WATCHES:
            _WATCHES[address] = SchedulerWatch(address)
        return _WATCHES[address]
