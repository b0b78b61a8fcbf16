"""`deepx-flow assets list|status|history|verify|gc` and `deepx-flow materialize`: a
project's assets, their stored versions and staleness, checking what is stored, removing
what killed writes left, and materializing a selection of them from a shell.

`-m` names the project's `dx.Definitions` as `load_definitions` reads it: a module, a `.py`
file, either one followed by `:ATTRIBUTE`. `history` and `verify` read the database (and the
stored data) only, so they need no module. Selection words are joined with commas into one
selection (`materialize -m p a+ b` is `a+,b`), so they are materialized together, upstream
first. A blocking check that fails still prints what was stored before the one-line error
(exit 1); `verify` exits 2 when a stored version is damaged.
"""

from __future__ import annotations

import argparse
import json
import os

from deepx_flow.errors import InputError, did_you_mean
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.text_table import local_time, text_table


def add_parsers(sub, parents) -> None:
    assets = sub.add_parser("assets", help="a project's assets: list, status, history",
                            parents=parents)
    assets_sub = assets.add_subparsers(dest="assets_command", required=True)
    # `--db` may come before or after the subcommand; without SUPPRESS the subcommand's
    # default would overwrite a value given before it.
    listing = assets_sub.add_parser("list", help="each asset: upstream, code version, "
                                                 "storage, latest stored version")
    status = assets_sub.add_parser("status", help="fresh or stale, and why, for each asset")
    history = assets_sub.add_parser("history", help="the stored versions of one asset")
    check = assets_sub.add_parser("verify", help="check stored versions without computing: "
                                                 "every chunk there, whole, its checksum")
    gc = assets_sub.add_parser("gc", help="remove the partial version folders that killed "
                                          "writes left (never one being written)")
    for p in (listing, status, history, check, gc):
        p.add_argument("--db", metavar="URL", default=argparse.SUPPRESS,
                       help="metadata database URL")
    gc.add_argument("name", nargs="*", help="asset names (default: every asset under the "
                                            "asset root)")
    gc.add_argument("--dry-run", action="store_true",
                    help="say what would be removed, and remove nothing")
    for p in (listing, status):
        _module_argument(p)
    history.add_argument("name", help="an asset name")
    history.add_argument("--limit", type=int, default=20, help="how many (newest first)")
    check.add_argument("name", nargs="?", help="an asset name (default: every stored asset)")
    check.add_argument("--latest", action="store_true",
                       help="only the newest version of each asset or partition")
    check.add_argument("--quick", action="store_true",
                       help="check the manifest and metadata, list the chunks and compare "
                            "their sizes with the manifest, without reading them (no "
                            "checksums)")
    check.add_argument("--upgrade", action="store_true",
                       help="bind versions stored before manifests recorded each chunk's "
                            "position: once they check whole, write their manifest anew and "
                            "record its digest")

    mat = sub.add_parser("materialize", help="compute and store a selection of assets",
                         parents=parents)
    _module_argument(mat)
    mat.add_argument("selection", nargs="*", default=["*"],
                     help="assets to store: name, +name (and its upstream), name+ (and its "
                          "downstream), *name, name*; default: all")
    mat.add_argument("--partitions", metavar="KEYS",
                     help="for partitioned assets: a key, KEY1,KEY2, or FIRST...LAST "
                          "(a backfill); default every partition")
    mat.add_argument("--only-stale", action="store_true",
                     help="of the selection, only assets that are stale or downstream of one")
    mat.add_argument("--scheduler", metavar="ADDRESS",
                     help="use a running Dask scheduler instead of an embedded cluster")
    mat.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="show a progress bar once a run has taken 2 s (default: in a "
                          "terminal)")


def _module_argument(parser) -> None:
    parser.add_argument("-m", "--module", required=True, metavar="MODULE[:ATTR]",
                        help="the module or .py file that holds the dx.Definitions")


def cmd_assets(args) -> int:
    return {"list": _list, "status": _status, "history": _history,
            "verify": _verify, "gc": _gc}[args.assets_command](args)


def _list(args) -> int:
    from deepx_flow.assets import catalog
    from deepx_flow.assets.loading import load_definitions
    from deepx_flow.meta import open_db

    defs = load_definitions(args.module)
    db = open_db(args.db)
    rows = []
    for name in defs.order:
        a = defs[name]
        if a.partitions is None:
            row = catalog.latest(db, name)
            latest = row.version[:12] if row else "never materialized"
        else:  # the newest partition stands for the rest
            made = catalog.latest_partitions(db, name)
            row = max(made.values(), key=lambda r: (r.created_at, r.id), default=None)
            latest = f"{len(made)} partitions" if made else "never materialized"
        rows.append((name, ", ".join(a.deps) or "-", a.code_version or "-", a.storage,
                     ", ".join(c.name for c in a.checks) or "-", latest,
                     _shape(row.shape) if row else "-", row.dtype if row else "-",
                     _time(row.created_at) if row else "-"))
    print(text_table(("asset", "upstream", "code", "storage", "checks", "latest", "shape",
                      "dtype", "materialized"), rows) if rows else
          f"{args.module} defines no assets")
    return 0


def _status(args) -> int:
    import deepx_flow as dx
    from deepx_flow.assets.loading import load_definitions

    print(dx.status(load_definitions(args.module), db=args.db))
    return 0


def _history(args) -> int:
    from deepx_flow.assets import catalog
    from deepx_flow.meta import open_db

    db = open_db(args.db)
    rows = catalog.history(db, args.name)
    if not rows:
        known = _stored_assets(db)
        raise InputError(f"asset {args.name!r} has no stored versions in {db.display_url}"
                         f"{did_you_mean(args.name, known)}")
    partitioned = any(r.partition is not None for r in rows)
    print(text_table(("version", *(("partition",) if partitioned else ()), "created", "shape",
                      "dtype", "bytes", "run", "seconds", "checks", "uri"),
                     [(r.version[:12], *((r.partition or "-",) if partitioned else ()),
                       _time(r.created_at), _shape(r.shape), r.dtype,
                       format_bytes(r.nbytes) if r.nbytes is not None else "-",
                       (r.run_id or "-")[:12],
                       f"{r.seconds:.2f}" if r.seconds is not None else "-",
                       {None: "-", True: "passed", False: "failed"}[r.checks_passed],
                       r.uri or "-") for r in rows[:args.limit]],
                     f"{args.name}: {len(rows)} stored versions, newest first"))
    return 0


def _verify(args) -> int:
    """Check stored versions; exit 2 (a DataError) when any is damaged, else 1 (an
    ExecutionError) when the store of any could not be read (that is not damage)."""
    from deepx_flow.assets import catalog
    from deepx_flow.errors import DataError, ExecutionError
    from deepx_flow.meta import open_db

    db = open_db(args.db)
    names = [args.name] if args.name else _stored_assets(db)
    rows = [r for name in sorted(names) for r in catalog.history(db, name)]
    if args.name and not rows:
        return _history(args)  # says there are no versions, and suggests a name
    if args.latest:
        newest = {}
        for r in rows:  # newest first
            newest.setdefault((r.asset, r.partition), r)
        rows = list(newest.values())
    table, damaged, unread, older = [], [], [], 0
    for r in rows:
        try:
            result = _verify_one(db, r, args.quick, args.upgrade, damaged)
        except ExecutionError as err:  # its store could not be read: not checked
            unread.append(err)
            result = f"NOT CHECKED: {err}"
        older += result.startswith("ok, older format")
        table.append((r.asset, r.partition or "-", r.version[:12], _time(r.created_at),
                      result))
    print(text_table(("asset", "partition", "version", "created", "result"), table,
                     f"{len(rows)} stored version{'s' * (len(rows) != 1)} checked")
          if table else
          f"no stored versions in {db.display_url}")
    if older:
        print(f"{older} version{'s were' if older != 1 else ' was'} stored before manifests "
              f"recorded where each chunk goes: {'their' if older != 1 else 'its'} chunks "
              f"are checked, not their positions; deepx-flow assets verify --upgrade binds "
              f"{'them' if older != 1 else 'it'} (a first read does too)")
    unchecked = (f"; {len(unread)} could not be read (not damage), the first: {unread[0]}"
                 if unread else "")
    if damaged:
        first = damaged[0]
        raise DataError(f"{len(damaged)} of {len(rows)} stored versions are damaged; the "
                        f"first: {first}{unchecked}", uri=first.uri, chunk=first.chunk,
                        asset=first.asset, version=first.version, partition=first.partition)
    if unread:
        raise ExecutionError(f"{len(unread)} of {len(rows)} stored versions could not be "
                             f"checked, their stores not read (not damage); the first: "
                             f"{unread[0]}")
    return 0


def _verify_one(db, row, quick: bool, upgrade: bool, damaged: list) -> str:
    """Check one stored version (and with `upgrade` bind it if it is of the older format);
    its result column. A damaged version's first problem is added to `damaged`."""
    from deepx_flow.assets import catalog
    from deepx_flow.assets.stored import PACKAGE_STORAGE, stored_as
    from deepx_flow.errors import DataError
    from deepx_flow.storage.engines import get_engine

    if row.storage == PACKAGE_STORAGE:
        return _verify_package(row, damaged)
    engine = get_engine(row.storage)
    if not row.uri or not callable(getattr(engine, "verify", None)):
        return f"not checked: storage {row.storage!r} cannot be verified"
    origin = stored_as(row)
    problems = engine.verify(row.uri, deep=not quick, origin=origin)
    older = origin["manifest"] is None and callable(getattr(engine, "upgrade", None))
    if not problems and older and upgrade:
        try:
            catalog.bind_manifest(db, row, engine.upgrade(row.uri, origin))
            return "ok, upgraded: its manifest now binds each chunk to its position"
        except DataError as err:  # changed since it was checked
            problems = [err]
    if problems:
        damaged.append(problems[0])
        more = f" (and {len(problems) - 1} more chunks)" if len(problems) > 1 else ""
        return f"DAMAGED: {problems[0].problem}{more}"
    sizes = " (sizes only)" if quick else ""
    return f"ok, older format{sizes}: chunk positions not bound" if older else f"ok{sizes}"


def _verify_package(row, damaged: list) -> str:
    """A served model's package (`dx.serving.package`): its package.json the one the row
    records, its graph and parameters the ones package.json records."""
    from pathlib import Path

    from deepx_flow.errors import DataError
    from deepx_flow.serving.model import PACKAGE_FILE, WEIGHTS_FILE, check_package
    folder = Path(row.uri or "")
    try:
        check_package(folder / "model.yaml", folder / WEIGHTS_FILE,
                      row.manifest_digest)
    except DataError as err:
        damaged.append(DataError(str(err), uri=row.uri, asset=row.asset,
                                 version=row.version, partition=row.partition))
        return f"DAMAGED: {err}"
    return f"ok: a model package, its {PACKAGE_FILE} and both digests"


def _gc(args) -> int:
    """Remove (or with --dry-run, list) partial version folders; say what was kept, and
    why, of the folders that no row publishes."""
    from deepx_flow.assets.gc import collect
    from deepx_flow.assets.root import asset_root
    from deepx_flow.meta import open_db

    verdicts = collect(open_db(args.db), args.name or None, dry_run=args.dry_run)
    removed = [v for v in verdicts if v.remove]
    verb = "would remove" if args.dry_run else "removed"
    rows = [(verb if v.remove else "kept", v.folder.asset, v.folder.version[:12], v.why,
             v.folder.uri) for v in verdicts]
    where = f"under {asset_root()}"
    print(text_table(("action", "asset", "version", "why", "folder"), rows,
                     f"{len(removed)} partial version folder{'s' * (len(removed) != 1)} "
                     f"{verb}, {len(verdicts) - len(removed)} kept, {where}")
          if rows else f"no unpublished version folders {where}")
    return 0


def cmd_materialize(args) -> int:
    import deepx_flow as dx
    from deepx_flow.assets.loading import load_definitions
    from deepx_flow.assets.selection import select
    from deepx_flow.errors import CheckFailed
    from deepx_flow.runtime.cluster import connect
    from deepx_flow.runtime.progress import RunProgress, wanted

    if args.db:  # the run records itself where the settings say
        os.environ["DEEPX_DB_URL"] = args.db
    defs = load_definitions(args.module)
    selection = ",".join(args.selection)
    names = select(defs, selection)  # a bad selection fails before a cluster is started
    if args.only_stale and not any(row.stale for row in dx.status(defs, db=args.db).rows
                                   if row.asset in names):
        print("nothing to materialize: the selected assets are fresh")
        return 0
    partitions = _partitions(args.partitions)
    # Each run's id (and dashboard link) is printed as it starts, on stderr.
    progress = RunProgress(show=wanted(args.progress), announce=True, label="materialize")
    try:
        with connect(scheduler=args.scheduler) as client:
            done = dx.materialize(defs, selection, partitions=partitions,
                                  only_stale=args.only_stale, client=client, db=args.db,
                                  progress=progress)
    except CheckFailed as err:  # what was stored is stored: say what, then why it stopped
        if err.materialized is not None:
            _print_materialized(err.materialized)
        raise
    _print_materialized(done)
    return 0


def _print_materialized(done) -> None:
    print(done)
    if done.run_ids:
        print(f"run{'s' if len(done.run_ids) > 1 else ''} {', '.join(done.run_ids)}, "
              f"{done.seconds:.2f} s")


def _partitions(text: str | None):
    """`--partitions`: None (all), one key, KEY1,KEY2 (a list) or FIRST...LAST (a range)."""
    if text is None or "..." in text or "," not in text:
        return text
    return [key.strip() for key in text.split(",") if key.strip()]


def _stored_assets(db) -> list[str]:
    from sqlmodel import select

    from deepx_flow.meta.models import AssetMaterialization

    with db.read() as session:
        return list(session.exec(select(AssetMaterialization.asset).distinct()))


def _shape(text: str) -> str:
    return "x".join(map(str, json.loads(text))) or "()"


def _time(t: float | None) -> str:
    return local_time(t)
