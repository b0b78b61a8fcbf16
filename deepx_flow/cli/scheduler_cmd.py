"""`deepx-flow scheduler -m MODULE[:ATTR]`: run a project's schedules until stopped.

One Dask client serves the daemon's whole life: the scheduler at `--scheduler` (or
DEEPX_SCHEDULER), else an embedded local cluster. `--once` evaluates the ticks due now,
waits for their runs and exits, for use from cron or CI.
"""

from __future__ import annotations

import os

from deepx_flow.errors import InputError


def add_parser(sub, parents) -> None:
    p = sub.add_parser("scheduler", parents=parents,
                       help="run a project's schedules: launch each cron tick once, record it")
    p.add_argument("-m", "--module", required=True, metavar="MODULE[:ATTR]",
                   help="the module or .py file with the dx.Definitions to run")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="use a running Dask scheduler instead of an embedded cluster")
    p.add_argument("--once", action="store_true",
                   help="evaluate the ticks due now, wait for their runs, exit")


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
    db = open_db(args.db)
    with connect(scheduler=args.scheduler) as client:
        daemon = SchedulerDaemon(defs, db, client, definitions=args.module)
        daemon.say(f"scheduler {daemon.me}: {len(defs.schedules)} schedule(s) from "
                   f"{args.module}; database {db.display_url}; Dask scheduler "
                   f"{client.scheduler.address}")
        return serve_until_signalled(daemon, once=args.once)
