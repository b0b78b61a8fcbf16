"""`dx.runs()`: the recorded runs, newest first, as `deepx-flow runs` lists them: a text
table at a prompt, an HTML table in a notebook; each row (`dx.runs()[0]`) one line, or its
facts and dashboard link as a table."""

from __future__ import annotations

from dataclasses import dataclass

from deepx_flow.text_table import html_facts, html_table, local_time, text_table

STATUSES = ("running", "succeeded", "failed", "interrupted")
HEADERS = ("run", "kind", "status", "started", "seconds", "tasks", "workers", "cluster",
           "error")


def seconds(run) -> str:
    """How long the run took, or "-" while it runs."""
    return f"{run.ended_at - run.started_at:.2f}" if run.ended_at else "-"


def first_line(text: str | None) -> str:
    """An error's first line, cut to a table cell."""
    return text.strip().splitlines()[0][:100] if text and text.strip() else ""


def run_row(run) -> tuple:
    """One run as a row under `HEADERS` (its id cut to 12 characters, enough to find it)."""
    return (run.id[:12], run.kind, run.status, local_time(run.started_at), seconds(run),
            run.n_tasks, run.n_workers, run.cluster, first_line(run.error))


@dataclass(frozen=True)
class RunInfo:
    """One recorded run (`run`: its `meta.models.Run` row)."""

    run: object

    def facts(self) -> list[tuple[str, str]]:
        from deepx_flow.runtime.progress import run_link
        r = self.run
        facts = [("status", r.status), ("kind", r.kind), ("started", local_time(r.started_at)),
                 ("seconds", seconds(r)), ("tasks", f"{r.n_tasks:,}"),
                 ("workers", str(r.n_workers)), ("cluster", f"{r.cluster} at {r.scheduler}"),
                 ("by", f"{r.username} on {r.host} (pid {r.pid})")]
        if r.error:
            facts.append(("error", first_line(r.error)))
        return facts + [("dashboard", run_link(r.id))]

    def __repr__(self) -> str:
        r = self.run
        error = first_line(r.error)
        return (f"<run {r.id} {r.kind} {r.status}: {r.n_tasks:,} tasks, {seconds(r)} s"
                + (f"; {error}" if error else "") + ">")

    def _repr_html_(self) -> str:
        return html_facts(f"run {self.run.id}", self.facts())


@dataclass(frozen=True)
class RunList:
    """Recorded runs, newest first; `[i]` is one (a `RunInfo`)."""

    runs: tuple
    where: str  # the database's display URL

    def __len__(self) -> int:
        return len(self.runs)

    def __getitem__(self, i):
        """One run (`RunInfo`), or for a slice the runs it takes (`RunList`)."""
        if isinstance(i, slice):
            return RunList(self.runs[i], self.where)
        return RunInfo(self.runs[i])

    def __str__(self) -> str:
        if not self.runs:
            return f"no runs in {self.where}"
        return text_table(HEADERS, [run_row(r) for r in self.runs])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        title = f"{len(self.runs)} run(s) in {self.where}, newest first"
        return html_table(HEADERS, [run_row(r) for r in self.runs], title)


def runs(limit: int = 20, status: str | None = None, db: str | None = None) -> RunList:
    """The `limit` most recent runs in the metadata database (`db`, default
    DEEPX_DB_URL or `.deepx/deepx.db`), of one `status` if given (running, succeeded,
    failed, interrupted)."""
    from deepx_flow.errors import InputError
    from deepx_flow.meta import open_db, queries
    if status is not None and status not in STATUSES:
        raise InputError(f"dx.runs: status must be one of {', '.join(STATUSES)}, got "
                         f"{status!r}")
    database = open_db(db)
    return RunList(tuple(queries.list_runs(database, limit, status)), database.display_url)


__all__ = ["runs", "RunList", "RunInfo", "run_row", "HEADERS", "STATUSES"]
