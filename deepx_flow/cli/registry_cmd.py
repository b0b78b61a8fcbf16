"""`deepx-flow registry`: what the registry holds, and measuring the network.

    deepx-flow registry show                          # the live clusters, from the database
    deepx-flow registry show --all                    # closed and gone clusters too
    deepx-flow registry show --scheduler ADDRESS      # register that cluster first
    deepx-flow registry probe --scheduler ADDRESS     # measure links, store, print them

`show` prints, per live scheduler, its workers (memory, devices, storage tiers) and the
matrices of measured links, then the number of registered operators (it registers this
installation's operators, built-in and from entry points, before counting them). A worker
is live while its driver's heartbeat keeps it seen (`registry/heartbeat.py`); `show` marks
those not seen within the heartbeat timeout gone, and with `--all` lists every cluster on
record and its gone workers.
`probe` registers the cluster, measures every ordered pair of workers
(`deepx_flow.registry.network`) and stores the result, which the compiler then uses for its
communication estimate. The database is `args.db` (`--db`, from the parent parsers main.py
passes), else `DEEPX_DB_URL`, else `.deepx/deepx.db`.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from deepx_flow.errors import ClusterError
from deepx_flow.text_table import local_time, text_table


def _size(value: str) -> int:
    from deepx_flow.registry.cluster import parse_bytes
    try:
        return parse_bytes(value)
    except ClusterError:
        raise argparse.ArgumentTypeError(f"cannot read {value!r} as a size (use e.g. 32MiB "
                                         f"or 4MB)") from None


def add_parser(subparsers, parents=()) -> None:
    """Add `registry show` and `registry probe` to the command's subparsers; `parents`
    (parsers with shared options such as --db) are given to both."""
    registry = subparsers.add_parser("registry", help="show the registry, or measure the "
                                                      "network between workers")
    sub = registry.add_subparsers(dest="registry_command", required=True,
                                  metavar="{show,probe}")
    show = sub.add_parser("show", help="print workers, devices, storage tiers, links and "
                                       "operators from the metadata database",
                          parents=list(parents))
    show.add_argument("--scheduler", metavar="ADDRESS",
                      help="register the cluster behind this scheduler first, and show only it")
    show.add_argument("--all", action="store_true", dest="everything",
                      help="show closed and gone clusters and workers too (the history)")
    probe = sub.add_parser("probe", help="measure bandwidth and latency between every pair "
                                         "of workers and store them", parents=list(parents))
    probe.add_argument("--scheduler", metavar="ADDRESS",
                       help="the cluster's scheduler (default: DEEPX_SCHEDULER)")
    probe.add_argument("--bytes", type=_size, default="32MiB", metavar="SIZE",
                       help="payload of each bandwidth transfer (default 32MiB)")
    probe.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                       help="start no new pair after this long (default 120)")


def run(args) -> int:
    from deepx_flow.meta import open_db
    db = open_db(getattr(args, "db", None))
    if args.registry_command == "probe":
        return _probe(args, db)
    return _show(args, db)


def _show(args, db) -> int:
    from deepx_flow.registry.heartbeat import mark_stale_gone
    from deepx_flow.registry.operators import register_operators
    scheduler = None
    if args.scheduler:
        scheduler = _register(args.scheduler, db)
    mark_stale_gone(db, time.time())
    operators = register_operators(db)
    everything = getattr(args, "everything", False)
    print(f"Metadata database: {db.display_url}")
    on_record = [scheduler] if scheduler else _schedulers(db)
    live = set(_schedulers(db, live_only=True))
    schedulers = on_record if everything or scheduler else \
        [s for s in on_record if s in live]
    if not on_record:
        print("\nNo cluster registered yet (deepx-flow registry show --scheduler ADDRESS).")
    elif not schedulers:
        print(f"\nNo live cluster; {len(on_record)} closed or gone on record (deepx-flow "
              f"registry show --all).")
    for address in schedulers:
        print()
        print("\n".join(_cluster_lines(db, address, everything=everything)))
    hidden = len(on_record) - len(schedulers)
    if hidden and schedulers:
        print(f"\n{hidden} closed or gone cluster(s) not shown (deepx-flow registry show "
              f"--all).")
    builtin = sum(r.source == "builtin" for r in operators)
    print(f"\nOperators: {len(operators)} registered ({builtin} built-in, "
          f"{len(operators) - builtin} from entry points; deepx-flow ops lists them)")
    return 0


def _probe(args, db) -> int:
    from deepx_flow.config import settings
    from deepx_flow.registry.network import probe_network
    from deepx_flow.registry.register import register_cluster
    from deepx_flow.runtime.cluster import open_client
    address = args.scheduler or settings().scheduler_address
    if not address:
        raise ClusterError("registry probe needs a cluster: --scheduler ADDRESS or "
                           "DEEPX_SCHEDULER")
    with open_client(address, set_as_default=False) as client:
        spec = register_cluster(client, db)
        if len(spec.workers) < 2:
            raise ClusterError(f"the cluster at {address} has {len(spec.workers)} worker; "
                               f"a network probe needs at least two")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = probe_network(client, db, nbytes=args.bytes, timeout=args.timeout)
        scheduler = str(client.scheduler.address)
    for w in caught:
        print(f"deepx-flow: warning: {w.message}", file=sys.stderr)
    print(f"Measured {len(found)} link(s) with {args.bytes / 2**20:g} MiB transfers.")
    print("\n".join(_cluster_lines(db, scheduler, workers_too=False)))
    return 0


def _register(address: str, db) -> str:
    from deepx_flow.registry.register import register_cluster
    from deepx_flow.runtime.cluster import open_client
    with open_client(address, set_as_default=False) as client:
        register_cluster(client, db)
        return str(client.scheduler.address)


def _schedulers(db, live_only: bool = False) -> list[str]:
    """Registered schedulers (those with a live worker, with `live_only`), most recently
    seen first."""
    from sqlmodel import col, func, select

    from deepx_flow.meta.models import Worker
    from deepx_flow.registry.heartbeat import live_since
    query = select(Worker.scheduler, func.max(Worker.last_seen)).group_by(Worker.scheduler)
    if live_only:
        query = query.where(Worker.status == "running",
                            col(Worker.last_seen) >= live_since(time.time()))
    with db.read() as session:
        rows = session.exec(query).all()
    return [s for s, _ in sorted(rows, key=lambda r: -r[1])]


def _cluster_lines(db, scheduler: str, workers_too: bool = True,
                   everything: bool = True) -> list[str]:
    """The lines of one cluster: a summary, its workers (only the live ones unless
    `everything`) with their devices and storage tiers, and its measured links."""
    from sqlmodel import select

    from deepx_flow.meta.models import Device, Link, StorageTier, Worker
    from deepx_flow.registry.heartbeat import is_live
    now = time.time()
    with db.read() as session:
        workers = session.exec(select(Worker).where(Worker.scheduler == scheduler)
                               .order_by(Worker.address)).all()
        ids = [w.id for w in workers]
        devices = session.exec(select(Device).where(Device.worker_id.in_(ids))).all()
        tiers = session.exec(select(StorageTier).where(StorageTier.worker_id.in_(ids))
                             .order_by(StorageTier.id)).all()
        links = session.exec(select(Link).where(Link.scheduler == scheduler)).all()
    running = [w for w in workers if is_live(w.status, w.last_seen, now)]
    label = {w.address: str(i) for i, w in enumerate(running)}
    last = max((w.last_seen for w in workers), default=0)
    lines = [f"Scheduler {scheduler}: {len(running)} worker(s) running, "
             f"{len(workers) - len(running)} gone; last seen {_when(last)}"]
    if workers_too:
        shown = workers if everything else running
        ids = {w.id for w in shown}
        lines += _worker_lines(shown, [d for d in devices if d.worker_id in ids],
                               [t for t in tiers if t.worker_id in ids], label, now)
    lines += _link_lines(links, running, label)
    return lines


def _device_text(d) -> str:
    """A registered GPU: name, total memory, and what was free and usable when registered."""
    from deepx_flow.registry.cluster import format_bytes
    notes = [f"{format_bytes(n)} {what}" for n, what in ((d.memory_free, "free"),
                                                        (d.memory_usable, "usable"))
             if n is not None]
    return f"{d.name} {format_bytes(d.memory_total or 0)}" + (
        f" ({', '.join(notes)})" if notes else "")


def _worker_lines(workers, devices, tiers, label, now: float) -> list[str]:
    from deepx_flow.registry.cluster import format_bytes
    from deepx_flow.registry.heartbeat import shown_status
    by_worker = {}
    for d in devices:
        by_worker.setdefault(d.worker_id, []).append(_device_text(d))
    rows = []
    for w in workers:
        rows.append((label.get(w.address, "-"), w.address, w.name, w.host, str(w.nthreads),
                     format_bytes(w.memory_limit) if w.memory_limit else "none",
                     format_bytes(w.memory_reserved or 0),
                     shown_status(w.status, w.last_seen, now),
                     "; ".join(by_worker.get(w.id, [])) or "-"))
    lines = _indent(text_table(("#", "address", "name", "host", "threads", "memory limit",
                                "reserved", "status", "devices"), rows))
    address = {w.id: w.address for w in workers}
    rows = []
    for t in tiers:
        capacity = "-" if t.capacity is None else format_bytes(t.capacity) + \
            (" free" if t.tier == "disk" else "")
        rows.append((label.get(address[t.worker_id], "-"), t.tier, t.location, capacity))
    lines += ["", "  Storage tiers:"] + _indent(text_table(("#", "tier", "location",
                                                             "capacity"), rows))
    return lines


def _link_lines(links, running, label) -> list[str]:
    measured = {(r.source, r.target): r for r in links
                if r.source in label and r.target in label}
    if not measured:
        return ["", "  Links: not measured (deepx-flow registry probe)"]
    protocols = sorted({r.protocol for r in measured.values()})
    lines = ["", f"  Links ({', '.join(protocols)}), from row to column:"]
    for title, cell in (("bandwidth GB/s", lambda r: f"{r.bandwidth / 1e9:.2f}"),
                        ("latency ms", lambda r: f"{r.latency * 1e3:.3f}")):
        rows = []
        for a in running:
            rows.append((label[a.address],) + tuple(
                "-" if a is b else (cell(measured[a.address, b.address])
                                    if (a.address, b.address) in measured else "?")
                for b in running))
        headers = (title,) + tuple(label[w.address] for w in running)
        lines += _indent(text_table(headers, rows)) + [""]
    return lines[:-1]


def _indent(table: str) -> list[str]:
    return ["  " + line for line in table.splitlines()]


def _when(t: float) -> str:
    return local_time(t, missing="never")
