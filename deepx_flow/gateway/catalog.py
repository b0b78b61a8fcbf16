"""What the metadata database knows, as the contract's catalog answers it: runs so far
(assets and the registry next). The same rows `deepx-flow runs` and the dashboard read."""

from __future__ import annotations

from deepx_flow.errors import InputError, shown
from deepx_flow.gateway.operations import NotFound
from deepx_flow.runtime.run_history import STATUSES

MAX_RUNS = 1000


def run_answer(run) -> dict:
    """A `meta.models.Run` row as the contract's Run."""
    return {"id": run.id, "status": run.status, "kind": run.kind,
            "graph_hash": run.graph_hash, "started_at": run.started_at,
            "ended_at": run.ended_at or 0.0, "error": run.error or "", "tasks": run.n_tasks,
            "workers": run.n_workers, "cluster": run.cluster}


def list_runs(db, status: str | None = None, limit: int | None = None) -> dict:
    """The newest runs first, at most `limit` (default 20, at most MAX_RUNS), of one
    `status` when given."""
    from deepx_flow.meta.queries import list_runs as newest
    if status and status not in STATUSES:
        raise InputError(f"status {shown(status)} is not one of {', '.join(STATUSES)}")
    if limit is None or limit == 0:
        limit = 20
    if type(limit) is not int or not 0 < limit <= MAX_RUNS:
        raise InputError(f"limit {shown(limit)} is not a whole number from 1 to {MAX_RUNS}")
    return {"runs": [run_answer(r) for r in newest(db, limit=limit, status=status or None)]}


def get_run(db, run_id: str) -> dict:
    """One run by its id or a prefix of it that names one run; NotFound otherwise."""
    from deepx_flow.meta.queries import find_run
    if not isinstance(run_id, str) or not run_id:
        raise NotFound(f"no run {shown(run_id)}")
    try:
        return run_answer(find_run(db, run_id))
    except InputError as err:
        if "ambiguous" in str(err):
            raise
        raise NotFound(str(err)) from None
