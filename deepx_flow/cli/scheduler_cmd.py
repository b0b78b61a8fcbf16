"""`deepx-flow scheduler -m MODULE[:ATTR]`: run a project's schedules until stopped.

One Dask client serves the daemon's whole life: the scheduler at `--scheduler` (or
DEEPX_SCHEDULER), else an embedded local cluster. `--once` evaluates the ticks due now,
waits for their runs and exits, for use from cron or CI. `--list` starts nothing: it prints
each schedule with its next ticks, so what a cron means is there to read.
"""

from __future__ import annotations

import os
import time

from deepx_flow.errors import InputError

MAX_LISTED_TICKS = 1000


def add_parser(sub, parents) -> None:
    p = sub.add_parser("scheduler", parents=parents,
                       help="run a project's schedules: launch each cron tick once, record it")
    p.add_argument("-m", "--module", required=True, metavar="MODULE[:ATTR]",
                   help="the module or .py file with the dx.Definitions to run")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="use a running Dask scheduler instead of an embedded cluster")
    p.add_argument("--once", action="store_true",
                   help="evaluate the ticks due now, wait for their runs, exit")
    p.add_argument("--list", action="store_true",
                   help="print each schedule and its next ticks, then exit (starts nothing)")
    p.add_argument("--ticks", type=int, default=5, metavar="N",
                   help="with --list: how many next ticks to show (default 5)")


def run(args) -> int:
    from deepx_flow.assets.loading import load_definitions
    from deepx_flow.meta import open_db
    from deepx_flow.runtime.cluster import connect
    from deepx_flow.scheduler.daemon import SchedulerDaemon, serve_until_signalled

    if args.db:  # the runs record themselves where the settings say
        os.environ["DEEPX_DB_URL"] = args.db
    defs = load_definitions(args.module)
    if not defs.schedules:
        raise InputError(f"{args.module} has no schedules: add them as "
                         f"dx.Definitions(..., schedules=[dx.schedule(...)])")
    if args.list:
        print(schedule_listing(defs.schedules, time.time(), args.ticks))
        return 0
    db = open_db(args.db)
    with connect(scheduler=args.scheduler) as client:
        daemon = SchedulerDaemon(defs, db, client, definitions=args.module)
        daemon.say(f"scheduler {daemon.me}: {len(defs.schedules)} schedule(s) from "
                   f"{args.module}; database {db.display_url}; Dask scheduler "
                   f"{client.scheduler.address}")
        return serve_until_signalled(daemon, once=args.once)


def schedule_listing(schedules, now: float, ticks: int = 5) -> str:
    """Each schedule (name, cron, time zone, what it materializes) and its next `ticks`
    cron times after `now`, in its time zone, with the gap between them."""
    from deepx_flow.scheduler.ticks import format_tick, next_tick

    if not 1 <= ticks <= MAX_LISTED_TICKS:
        raise InputError(f"--ticks must be between 1 and {MAX_LISTED_TICKS}, not {ticks}")
    lines = []
    for s in schedules:
        stale = ", only what is stale" if s.only_stale else ""
        lines.append(f"{s.name}: cron '{s.cron}' in {s.timezone}; materializes "
                     f"{s.selection}{stale}; catch-up {s.catchup}")
        at, previous = now, None
        for _ in range(ticks):
            at = next_tick(s, at)
            gap = f"  (+{_duration(at - previous)})" if previous is not None else ""
            lines.append(f"  next {format_tick(at, s.timezone)}{gap}")
            previous = at
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """A gap between ticks as people say it: 10 s, 5 min, 1 h 30 min, 1 day."""
    seconds = round(seconds)
    for size, unit in ((86400, "day"), (3600, "h"), (60, "min")):
        if seconds >= size:
            whole, rest = divmod(seconds, size)
            text = f"{whole} {unit}{'s' if unit == 'day' and whole > 1 else ''}"
            return text + (f" {_duration(rest)}" if rest else "")
    return f"{seconds} s"
