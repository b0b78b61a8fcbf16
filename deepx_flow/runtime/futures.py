"""Saying why a Dask future did not finish, in one line, the same way everywhere; and keeping
Dask's internal control flow out of the user's terminal."""

from __future__ import annotations

import logging


def describe_error(err: BaseException) -> str:
    """`TypeName: message`, or what happened when the error has no message (an interrupt
    is "interrupted (KeyboardInterrupt)", not "KeyboardInterrupt: ")."""
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt: Ctrl-C or the kernel's stop button)"
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _not_a_gather_exit(record: logging.LogRecord) -> bool:
    err = record.exc_info[1] if record.exc_info else None
    return not (type(err).__name__ == "AllExit"
                and type(err).__module__ == "distributed.client")


def quiet_interrupted_gathers() -> None:
    """An interrupted `client.gather` leaves tasks that end in distributed's `AllExit` (its
    way of stopping a gather early, never an error); asyncio then prints each as "Task
    exception was never retrieved" with a traceback. Drop just those records."""
    logger = logging.getLogger("asyncio")
    if _not_a_gather_exit not in logger.filters:
        logger.addFilter(_not_a_gather_exit)


def error_of(future) -> BaseException:
    """A failed future's error; the reason it cannot be fetched, if it cannot."""
    try:
        return future.exception()
    except Exception as fetch:  # the scheduler is gone, or the error does not unpickle
        return fetch


def why_not_finished(future) -> str:
    """`TypeName: message` of a failed future's error, or its status ("cancelled", "lost")
    when it has none; an error that cannot be fetched is described instead."""
    if future.status != "error":
        return future.status
    return describe_error(error_of(future))


def blamed_key(client, key):
    """The task whose own error made `key` fail (Dask marks every task downstream of a failed
    one as failed too); `key` itself when the scheduler cannot say."""
    def blame(dask_scheduler, key):
        ts = dask_scheduler.tasks.get(key)
        return ts.exception_blame.key if ts is not None and ts.exception_blame else key
    try:
        return client.run_on_scheduler(blame, key=key)
    except Exception:  # the scheduler is gone: the dependent's key is what we have
        return key


def cancel_and_settle(client, futures, timeout: float = 30.0) -> None:
    """Cancel `futures` and wait (at most `timeout` s) until none of their tasks is still
    executing on a worker: Dask's cancel does not stop a running task, and one that writes
    to storage must not write after its writer's cleanup. Best effort: never raises."""
    import time
    keys = {f.key for f in futures}
    try:
        client.cancel(futures)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = client.run(_executing, keys=keys)
            if not any(running.values()):
                return
            time.sleep(0.05)
    except Exception:  # the cluster is gone: nothing runs there any more
        return


def _executing(dask_worker, keys):
    return [ts.key for ts in getattr(dask_worker.state, "executing", ()) if ts.key in keys]
