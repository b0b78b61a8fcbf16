"""Stopping a run from another thread: `dx.run(..., cancel=token)`, then `token.cancel()`.

The gateway runs each execution in a thread of its own and cancels it when a client asks
(`POST /v1/operations/{id}:cancel`); a notebook can do the same from a button. Cancelling
cancels the run's futures on the cluster (their tasks stop being scheduled; a task already
running finishes, and its result is dropped), and the run raises `RunCancelled` and is
recorded `interrupted`, as Ctrl-C leaves it. A token cancelled before its run is submitted
cancels the run as soon as it is; one cancelled after the run ended does nothing.
"""

from __future__ import annotations

import threading

from deepx_flow.errors import DeepxError


class RunCancelled(DeepxError):
    """A run was stopped by `Cancellation.cancel` before it finished."""

    exit_code = 130


class Cancellation:
    """A token for one run (or several, one after another): `cancel()` from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._watched: list = []  # (client, futures) of runs under way

    @property
    def cancelled(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        return self._reason

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the runs this token watches (and any it is given later)."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            watched = list(self._watched)
        for client, futures in watched:
            _cancel(client, futures)

    def watch(self, client, futures) -> None:
        """Cancel `futures` on `client` when the token is cancelled: now, if it was."""
        with self._lock:
            self._watched.append((client, futures))
            cancelled = self._reason is not None
        if cancelled:
            _cancel(client, futures)

    def forget(self, futures) -> None:
        """Stop watching `futures` (their run ended)."""
        with self._lock:
            self._watched = [(c, f) for c, f in self._watched if f is not futures]

    def error(self, run_id: str | None) -> RunCancelled:
        """The error a run cancelled by this token raises."""
        which = f"run {run_id}" if run_id else "the run"
        return RunCancelled(f"{which} was cancelled before it finished: {self._reason}")


def _cancel(client, futures) -> None:
    try:
        client.cancel(futures)
    except Exception:  # the cluster is gone already: nothing of the run is left to stop
        pass
