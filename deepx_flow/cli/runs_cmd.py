"""`deepx-flow runs`, `deepx-flow runs show RUN_ID` and `deepx-flow placement RUN_ID`:
recorded runs, their tasks and errors, and where their chunks are."""

from __future__ import annotations

import argparse
import datetime as dt
import math

from deepx_flow.registry.cluster import format_bytes
from deepx_flow.runtime.run_history import HEADERS, STATUSES, first_line, run_row, seconds
from deepx_flow.text_table import text_table


def add_parsers(sub, parents) -> None:
    runs = sub.add_parser("runs", help="list recorded runs; 'runs show RUN_ID' shows one",
                          parents=parents)
    runs_sub = runs.add_subparsers(dest="runs_command")
    runs.add_argument("--limit", type=int, default=20, help="how many (newest first)")
    runs.add_argument("--status", choices=STATUSES)
    show = runs_sub.add_parser("show", help="one run: plan, tasks by operator, errors")
    # `--db` may come before or after `show`; without SUPPRESS the subcommand's default
    # would overwrite a value given before it.
    show.add_argument("--db", metavar="URL", default=argparse.SUPPRESS,
                      help="metadata database URL")
    show.add_argument("run_id", help="a run id, or the start of one")
    show.add_argument("--tasks", action="store_true", help="list every task")

    where = sub.add_parser("placement", help="where each chunk of a run's tensors is",
                           parents=parents)
    where.add_argument("run_id", help="a run id, or the start of one")
    where.add_argument("--tensor", help="only this tensor key")
    where.add_argument("--all", action="store_true",
                       help="also chunks that were released or lost")


def cmd_runs(args) -> int:
    # The database's modules (SQLAlchemy, SQLModel: a second to import here) are imported by
    # the commands that read it, not by every command's parser.
    from deepx_flow.meta import open_db, queries
    db = open_db(args.db)
    if getattr(args, "runs_command", None) == "show":
        return _show(db, args)
    rows = [run_row(r) for r in queries.list_runs(db, args.limit, args.status)]
    print(text_table(HEADERS, rows) if rows else f"no runs in {db.display_url}")
    return 0


def _show(db, args) -> int:
    from deepx_flow.meta import queries
    run = queries.find_run(db, args.run_id)
    ratio = _ratio(math.inf if run.compute_comm_ratio is None else run.compute_comm_ratio)
    print(f"run {run.id}  {run.kind}  {run.status}\n"
          f"  started {_time(run.started_at)}, {seconds(run)} s, by {run.username or '?'} "
          f"on {run.host} (pid {run.pid})\n"
          f"  cluster {run.cluster} ({run.n_workers} workers) at {run.scheduler}\n"
          f"  graph {run.graph_hash}; {run.n_tasks} tasks, {run.n_chunks} chunks; "
          f"planned compute/communication {ratio}")
    if run.error:
        print(f"  error: {run.error}")
    summary = queries.task_summary(db, run.id)
    print(f"  measured compute/communication {_ratio(queries.measured_ratio(summary))}")
    print()
    print(text_table(("operator", "tasks", "failed", "compute s", "fetch s", "bytes out"),
                     [(op, n, failed, f"{secs:.3f}", "-" if comm is None else f"{comm:.3f}",
                       format_bytes(nbytes))
                      for op, n, failed, secs, comm, nbytes in summary],
                     "tasks by operator") if summary else "no tasks recorded")
    tasks = queries.run_tasks(db, run.id)
    failed = [t for t in tasks if t.status == "erred"]
    if failed:
        print()
        print(text_table(("key", "worker", "attempts", "error"),
                         [(t.key, t.worker, t.attempts, first_line(t.error)) for t in failed],
                         "failed tasks"))
    if args.tasks:
        print()
        print(text_table(("key", "operator", "worker", "start", "seconds", "bytes in",
                          "bytes out", "attempts", "status"),
                         [(t.key, t.operator, t.worker, _time(t.start, ms=True),
                           f"{t.stop - t.start:.3f}" if t.start and t.stop else "-",
                           _size(t.bytes_in), _size(t.bytes_out), t.attempts, t.status)
                          for t in tasks], "tasks"))
    events = queries.run_events(db, run.id)
    if events:
        print()
        print(text_table(("at", "event", "worker", "key", "message"),
                         [(_time(e.at, ms=True), e.kind, e.worker, e.key, e.message)
                          for e in events], "events"))
    _training(db, run)
    if run.explain:
        print()
        print(run.explain)
    return 0


# The most steps `runs show` lists of a training (evenly spaced, the last one included).
TRAINING_ROWS = 20


def _training(db, run) -> None:
    """The metrics per step of the training this run is one graph of."""
    from deepx_flow.train import records
    training = records.training_of_run(db, run.id)
    if training is None:
        return
    metrics = records.metrics(db, training.id)
    print()
    resumed = f", resumed from {training.resumed_from[:12]}" if training.resumed_from else ""
    print(f"training {training.id}  {training.status}: {training.steps_done} of "
          f"{training.steps} steps{resumed}; {training.optimizer}, batch "
          f"{training.batch_size}, seed {training.seed}"
          + (f", checkpoints in asset {training.asset}" if training.asset else ""))
    steps = sorted({s for values in metrics.values() for s, _ in values})
    if not steps:
        print("no steps recorded yet")
        return
    if len(steps) > TRAINING_ROWS:
        at = [round(i * (len(steps) - 1) / (TRAINING_ROWS - 1)) for i in range(TRAINING_ROWS)]
        steps = [steps[i] for i in sorted(set(at))]
    names = [n for n in ("loss", "eval_loss", "lr", "grad_norm", "samples_per_second")
             if n in metrics] + sorted(n for n in metrics if n not in (
                 "loss", "eval_loss", "lr", "grad_norm", "samples_per_second"))
    by_name = {n: dict(metrics[n]) for n in names}
    rows = [(step, *[_metric(by_name[n].get(step)) for n in names]) for step in steps]
    print(text_table(("step", *[n.replace("_", " ") for n in names]), rows,
                     "metrics by step"))


def _metric(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def cmd_placement(args) -> int:
    from deepx_flow.meta import open_db, queries
    from deepx_flow.runtime.placement import placement_table
    db = open_db(args.db)
    run = queries.find_run(db, args.run_id)
    rows = queries.placements(db, run_id=run.id, tensor=args.tensor, current=not args.all)
    print(placement_table(rows, f"chunks of run {run.id}") if rows else
          f"run {run.id} has no {'' if args.all else 'held '}chunks recorded")
    return 0


def _time(t: float | None, ms: bool = False) -> str:
    if t is None:
        return "-"
    stamp = dt.datetime.fromtimestamp(t)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if ms else \
        stamp.strftime("%Y-%m-%d %H:%M:%S")


def _size(n) -> str:
    return format_bytes(n) if n is not None else "-"


def _ratio(value: float | None) -> str:
    return "-" if value is None else "inf" if math.isinf(value) else f"{value:.1f}"
