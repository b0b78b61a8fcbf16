"""Which registered workers are alive: the rule readers apply, and the heartbeat that feeds it.

A `workers` row says `running` from the moment a driver registers it (`register.py`). Nothing
in the row could tell a cluster that is still up from one whose process was killed, so:

- The rule (pure, `is_live`): a row is live while its status is `running` and its
  `last_seen` is at most the heartbeat timeout old (`settings().heartbeat_timeout_s`,
  DEEPX_HEARTBEAT_TIMEOUT_S, default `TIMEOUT_S`: twelve beats, so a driver busy for most of
  a minute still counts). Readers (`registry show`, the dashboard) select with
  `live_since(now)`; `registry show` also writes the verdict down (`mark_stale_gone`).
- The heartbeat: while a driver process holds a cluster it registered (its embedded cluster
  or a client it was given: `hold(client, db)`, called when `membership.live_spec`
  registers one), a daemon thread here sets `last_seen` of the workers the scheduler lists
  now, every `settings().heartbeat_s` (DEEPX_HEARTBEAT_S, default `PERIOD_S`): one small
  round trip to the scheduler (its worker addresses) and one short UPDATE per cluster and
  database. A worker the scheduler no longer lists is not refreshed, so it goes stale.
- The end: a cluster this process runs (the embedded one, or a `LocalCluster` the user
  made here: the client's `cluster` is set) is marked gone when it closes (`release`, from
  `dx.shutdown()` and the embedded cluster's close), when the user closes its client or the
  cluster (seen at the next beat: `beat_step`), at exit, and on SIGTERM (the signal
  Jupyter sends a kernel that is slow to stop: with SIGTERM's default action, a handler
  here marks the clusters gone, then lets the signal end the process as it would have).
  A client of a scheduler elsewhere only stops beating: the cluster may be another
  driver's too, and its rows go stale unless someone still holds it.

One thread serves every cluster the process holds; it ends when the last one is released,
and a forked child holds nothing (the parent's clusters are not its to mark).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field

from deepx_flow.config import Settings, settings
from deepx_flow.errors import DeepxError

log = logging.getLogger(__name__)

PERIOD_S = Settings.heartbeat_s  # the default beat (5 s)
TIMEOUT_S = Settings.heartbeat_timeout_s  # the default age a live row may have (60 s)
SIGTERM_MARK_S = 2.0  # what a SIGTERM waits at most for the database before ending
_CLOSED = frozenset({"closing", "closed", "failed", "closing_gracefully", "stopped"})


# --- the rule (pure) --------------------------------------------------------------------

def is_live(status: str | None, last_seen: float | None, now: float,
            timeout: float | None = None) -> bool:
    """Whether a worker row counts as alive at `now`: `running`, and seen within `timeout`
    seconds (default: the configured heartbeat timeout)."""
    timeout = settings().heartbeat_timeout_s if timeout is None else timeout
    return status == "running" and last_seen is not None and now - last_seen <= timeout


def live_since(now: float, timeout: float | None = None) -> float:
    """The oldest `last_seen` of a live row at `now` (for queries: `last_seen >= this`)."""
    return now - (settings().heartbeat_timeout_s if timeout is None else timeout)


def shown_status(status: str | None, last_seen: float | None, now: float,
                 timeout: float | None = None) -> str:
    """A row's status as readers show it: `running`, or `gone` (marked, or gone stale)."""
    return "running" if is_live(status, last_seen, now, timeout) else "gone"


def beat_step(client_status: str, cluster_status: str | None) -> str:
    """What a beat does for one held cluster: `refresh` its workers, `wait` (the client is
    connecting), `gone` (a cluster of this process closed, or its client did: mark it gone
    and let go) or `drop` (the client of a scheduler elsewhere closed: let go).
    `cluster_status` is the status of the cluster object in this process, None when the
    scheduler runs elsewhere."""
    if cluster_status in _CLOSED:
        return "gone"
    if client_status in _CLOSED:
        return "drop" if cluster_status is None else "gone"
    return "refresh" if client_status == "running" else "wait"


# --- the database -----------------------------------------------------------------------

def refresh(db, scheduler: str, addresses, now: float) -> int:
    """Mark `addresses` of `scheduler` seen (and running) at `now`; returns rows changed."""
    from sqlmodel import col, update

    from deepx_flow.meta.models import Worker
    addresses = sorted(addresses)
    if not addresses:
        return 0
    with db.begin() as conn:
        return conn.execute(update(Worker).where(
            Worker.scheduler == scheduler, col(Worker.address).in_(addresses),
            col(Worker.last_seen) < now).values(last_seen=now, status="running")).rowcount


def mark_stale_gone(db, now: float, timeout: float | None = None) -> int:
    """Mark gone the running rows not seen within the timeout; returns how many."""
    from sqlmodel import col, update

    from deepx_flow.meta.models import Worker
    with db.begin() as conn:
        return conn.execute(update(Worker).where(
            Worker.status == "running", col(Worker.last_seen) < live_since(now, timeout))
            .values(status="gone")).rowcount


# --- holding clusters -------------------------------------------------------------------

@dataclass
class _Hold:
    """One client this process registered a cluster through, and where it registered it."""

    key: int  # id(client)
    client: weakref.ref
    scheduler: str
    owned: bool  # the cluster runs in this process (the client's `cluster` is set)
    dbs: dict = field(default_factory=dict)  # id -> Database
    lock: threading.Lock = field(default_factory=threading.Lock)  # a write, or the release
    released: bool = False


_holds: dict[int, _Hold] = {}  # id(client) -> its hold
_lock = threading.Lock()
_wake = threading.Event()  # set when nothing is held any more: the thread ends now
_thread: threading.Thread | None = None
_atexit_pid: int | None = None  # the process that registered `_at_exit`
_sigterm_pid: int | None = None  # the process whose SIGTERM handler is `_on_sigterm`


def hold(client, db) -> None:
    """Keep the workers of `client`'s cluster seen in `db` while the client runs (see the
    module docstring). Calling it again for the same client and database does nothing."""
    global _thread
    with _lock:
        found = _holds.get(id(client))
        if found is None or found.client() is not client:
            found = _holds[id(client)] = _Hold(
                id(client), weakref.ref(client), str(client.scheduler.address),
                getattr(client, "cluster", None) is not None)
        found.dbs[id(db)] = db
        _install_hooks()
        if _thread is None:  # (the thread clears it, under `_lock`, when it ends)
            _thread = threading.Thread(target=_beat_forever, daemon=True,
                                       name="deepx-registry-heartbeat")
            _thread.start()


def release(client, gone: bool) -> bool:
    """Stop holding `client`'s cluster; with `gone`, mark its workers gone in every database
    it was registered in. False when it was not held."""
    with _lock:
        found = _holds.get(id(client))
    if found is None or found.client() is not client:
        return False
    return _release(found, gone)


def forget_database(url: str) -> None:
    """Stop writing to the database at `url` (it is about to be dropped: a test's): holds
    keep beating, and marking gone, in their other databases only."""
    with _lock:  # no hold adds a database meanwhile; no beat writes to it after this
        for found in _holds.values():
            with found.lock:
                for key in [k for k, db in found.dbs.items() if db.url == url]:
                    del found.dbs[key]


def held() -> list[str]:
    """The schedulers this process holds (for tests and diagnostics)."""
    with _lock:
        return sorted(h.scheduler for h in _holds.values())


def _release(found: _Hold, gone: bool) -> bool:
    with _lock:
        if _holds.get(found.key) is not found:
            return False  # released already, by another thread
        del _holds[found.key]
        if not _holds:
            _wake.set()
            _restore_sigterm()
    with found.lock:  # a beat writing now finishes first; none writes after this
        found.released = True
        if gone:
            _mark_gone(found)
    return True


def _mark_gone(found: _Hold) -> None:
    from deepx_flow.registry.register import mark_gone
    for db in found.dbs.values():
        try:
            mark_gone(db, found.scheduler)
        except Exception as err:  # the database may be unusable; the cluster is gone anyway
            log.warning("deepx_flow: could not mark the workers of %s gone in %s: %s",
                        found.scheduler, db.display_url, err)


def _beat_forever() -> None:
    global _thread
    while True:
        _wake.wait(_period())
        with _lock:
            if not _holds:
                _thread = None
                return
            _wake.clear()
            holds = list(_holds.values())
        for found in holds:
            try:
                _beat(found)
            except Exception as err:  # a beat must never end the thread
                log.debug("deepx_flow: heartbeat of %s: %s", found.scheduler, err)


def _period() -> float:
    """The beat's period: the setting, or the default while the setting is unreadable. A bad
    DEEPX_HEARTBEAT_S set while a cluster is held is refused where it is read for the user
    (the CLI, `dx.run`); the thread that keeps every held cluster seen must not end on it, or
    no cluster of the process would be seen again (nothing restarts it while any is held)."""
    try:
        return settings().heartbeat_s
    except DeepxError:
        return PERIOD_S


def _beat(found: _Hold) -> None:
    client = found.client()
    if client is None:  # dropped without being closed: nothing left to ask
        _release(found, gone=False)
        return
    cluster = getattr(client, "cluster", None) if found.owned else None
    cluster_status = None if cluster is None else _status_name(getattr(cluster, "status", ""))
    step = beat_step(_status_name(client.status), cluster_status)
    if step in ("gone", "drop"):
        _release(found, gone=step == "gone")
        return
    if step == "wait":
        return
    addresses = client.sync(client.scheduler.ncores,
                            callback_timeout=max(1.0, _period()))
    now = time.time()
    with found.lock:
        if found.released:
            return
        for db in list(found.dbs.values()):
            try:
                refresh(db, found.scheduler, addresses, now)
            except Exception as err:  # a busy or lost database: the next beat tries again
                log.debug("deepx_flow: heartbeat of %s in %s: %s", found.scheduler,
                          db.display_url, err)


def _status_name(status) -> str:
    return str(getattr(status, "name", status))


# --- the end of the process -------------------------------------------------------------

def _install_hooks() -> None:
    """On a hold (called with `_lock`): once per process, at exit, mark this process's own
    clusters gone; and on SIGTERM too, while its action is the default one."""
    global _atexit_pid, _sigterm_pid
    if _atexit_pid != os.getpid():
        _atexit_pid = os.getpid()
        atexit.register(_at_exit)
    if _sigterm_pid != os.getpid() and threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_pid = os.getpid()


def _restore_sigterm() -> None:
    """SIGTERM's default action back once nothing is held (called with `_lock`; only the
    main thread can: elsewhere the handler stays, and does nothing but the default)."""
    global _sigterm_pid
    if _sigterm_pid == os.getpid() and threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _sigterm_pid = None


def _owned_gone() -> None:
    """Release every hold, marking gone the clusters this process runs."""
    with _lock:
        holds = list(_holds.values())
    for found in holds:
        _release(found, gone=found.owned)


def _at_exit() -> None:
    if _atexit_pid == os.getpid():
        _owned_gone()


def _on_sigterm(signum, frame) -> None:
    """Mark this process's clusters gone (waiting `SIGTERM_MARK_S` at most for the
    database), then end the process as SIGTERM's default action does."""
    if _sigterm_pid == os.getpid():
        marking = threading.Thread(target=_owned_gone, daemon=True)
        marking.start()
        marking.join(SIGTERM_MARK_S)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _forget_in_child() -> None:
    """A forked child holds none of its parent's clusters, and has no heartbeat thread."""
    global _thread, _lock, _wake, _atexit_pid, _sigterm_pid
    _holds.clear()
    _thread, _lock, _wake = None, threading.Lock(), threading.Event()
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _atexit_pid = _sigterm_pid = None


os.register_at_fork(after_in_child=_forget_in_child)


__all__ = ["PERIOD_S", "TIMEOUT_S", "beat_step", "held", "hold", "is_live", "live_since",
           "mark_stale_gone", "refresh", "release", "shown_status"]
