"""The progress of a run while its driver waits: tasks finished of the plan's total, bytes
computed, time elapsed and an estimate of the time left, in a terminal or a notebook.

Shown by default when the session is interactive (a terminal, IPython, a notebook kernel) and
the run is still going after `settings().progress_after_s` (DEEPX_PROGRESS_AFTER_S, 2 s by
default), so quick cells print nothing. When it shows, a line first names the run and its
dashboard page, then a bar follows (tqdm: a text bar on stderr, a widget in notebooks with
ipywidgets). The counts come from the scheduler's supervisor (`supervisor.progress`), which
sees every task of the run finish, not only the outputs the driver holds; a background
thread asks for them a couple of times a second.
"""

from __future__ import annotations

import sys
import threading

from deepx_flow.config import settings
from deepx_flow.errors import InputError, shown
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.terminal_text import raw_stream

POLL_S = 0.5  # how often a shown bar asks the scheduler


def interactive() -> bool:
    """Whether a person is likely watching: a terminal on stderr, IPython or a kernel."""
    return hasattr(sys, "ps1") or "ipykernel" in sys.modules or sys.stderr.isatty()


def checked_progress(progress):
    """The `progress=` argument of a run as given, if it is True, False, None or a
    RunProgress; an InputError saying so otherwise."""
    if progress is None or isinstance(progress, (bool, RunProgress)):
        return progress
    raise InputError(f"progress must be True, False or None (None: when the session is "
                     f"interactive), got {type(progress).__name__} {shown(progress)}")


def wanted(progress: bool | None) -> bool:
    """`progress` as given (True, False: `checked_progress`), else whether the session is
    interactive."""
    return interactive() if checked_progress(progress) is None else bool(progress)


def run_link(run_id: str) -> str:
    """The run's page on the dashboard (`deepx-flow ui`; DEEPX_DASHBOARD_URL elsewhere)."""
    return f"{settings().dashboard_url}/run?id={run_id}"


def _bar_class():
    """tqdm's notebook widget where ipywidgets can draw it, else its text bar (tqdm.auto
    would warn in a notebook without ipywidgets, then fall back to the same)."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        from tqdm.std import tqdm
        return tqdm
    from tqdm.auto import tqdm
    return tqdm


class RunProgress:
    """A progress bar for one run, shown from `show_after` seconds until the `with` block
    ends, when `show`; with `announce`, the run's header line is printed as it starts (the
    CLI does, since its user needs the run id whatever the run's length).

    `attach` is called when the run is submitted, with its client, id and task count and
    whether it has a row in the metadata database (then its dashboard link is printed)."""

    def __init__(self, show: bool = True, announce: bool = False, label: str = "run",
                 show_after: float | None = None, stream=None):
        self.show, self.announce, self.label = show, announce, label
        self.show_after = settings().progress_after_s if show_after is None else show_after
        self.stream = stream if stream is not None else sys.stderr
        self.client = self.run_id = None
        self.total, self.recorded = 0, False
        self.shown = False  # whether the bar appeared
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, progress, label: str = "run") -> "RunProgress":
        """`progress` as a RunProgress: given one, itself; True shows it from the start,
        None once the run has gone on for `settings().progress_after_s` when the session
        is interactive, False never."""
        if isinstance(progress, RunProgress):
            return progress
        return cls(show=wanted(progress), label=label,
                   show_after=0.0 if progress is True else None)

    def attach(self, client, run_id: str, total: int, recorded: bool) -> None:
        self.client, self.run_id, self.total, self.recorded = client, run_id, total, recorded
        # A re-planned run attaches the same object again.
        self._stop, self._thread, self._bar = threading.Event(), None, None
        self.shown = False
        if self.announce:
            print(self.header(), file=self.stream, flush=True)

    def __enter__(self) -> "RunProgress":
        if self.show and self.client is not None:
            if self.show_after <= 0:
                self._show()  # here, so that even a run quicker than a thread shows it
            self._thread = threading.Thread(target=self._follow, daemon=True,
                                            name=f"deepx-progress-{self.run_id}")
            self._thread.start()
        return self

    def __exit__(self, kind, error, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            if kind is None:  # finished: chunks an earlier run had computed count too
                self._bar.update(self.total - self._bar.n)
            self._bar.close()

    def header(self) -> str:
        """The line that names the run: its id, its size and where to look at it."""
        text = f"deepx_flow {self.label} {self.run_id}: {self.total:,} tasks"
        if self.recorded:
            text += f"; dashboard {run_link(self.run_id)} (deepx-flow ui)"
        return text

    def _show(self) -> None:
        if not self.announce:
            print(self.header(), file=self.stream, flush=True)
        with self._lock:
            # The bar moves the cursor on purpose, and its text is its own: it writes
            # beneath the command line's escaping of control characters.
            self._bar = _bar_class()(total=self.total, unit="task", desc=self.label,
                                     file=raw_stream(self.stream), dynamic_ncols=True)
            self.shown = True

    def _follow(self) -> None:
        if not self.shown:
            if self._stop.wait(self.show_after):
                return
            self._show()
        while not self._stop.wait(POLL_S):
            self._poll()

    def _poll(self) -> None:
        from deepx_flow.runtime.supervisor import progress
        try:
            done, nbytes = self.client.run_on_scheduler(progress, run_id=self.run_id)
        except Exception:  # a display only: the run's own failure is what the driver reports
            return
        with self._lock:
            self._bar.update(max(0, min(done, self.total) - self._bar.n))
            self._bar.set_postfix_str(format_bytes(nbytes), refresh=True)


__all__ = ["RunProgress", "checked_progress", "interactive", "wanted", "run_link"]
