"""Saying why a Dask future did not finish, in one line, the same way everywhere."""

from __future__ import annotations


def why_not_finished(future) -> str:
    """`TypeName: message` of a failed future's error, or its status ("cancelled", "lost")
    when it has none; an error that cannot be fetched is described instead."""
    if future.status != "error":
        return future.status
    try:
        err = future.exception()
    except Exception as fetch:  # the scheduler is gone, or the error does not unpickle
        err = fetch
    return f"{type(err).__name__}: {err}"


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
