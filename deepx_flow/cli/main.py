"""The `deepx-flow` command: run and explain YAML graphs, list operators, show recorded runs.

    deepx-flow run graphs/mlp_forward.yaml --input x=x.npy --output y=y.npy
    deepx-flow explain graphs/mlp_forward.yaml --cluster graphs/clusters/8xH100.yaml
    deepx-flow ops                       # operators, functions, speeds measured per worker
    deepx-flow runs                      # recorded runs, newest first
    deepx-flow runs show RUN_ID          # one run: tasks by operator, errors, its plan
    deepx-flow placement RUN_ID          # which worker holds each chunk
    deepx-flow registry show|probe       # registered workers, tiers, links; measure links
    deepx-flow assets list|status -m my_pipeline   # a project's assets, fresh or stale
    deepx-flow assets history NAME       # the stored versions of one asset
    deepx-flow assets verify [NAME]      # check stored chunks: there, whole, checksums
    deepx-flow materialize -m my_pipeline [SELECTION ...] [--only-stale]
    deepx-flow scheduler -m my_pipeline [--once]   # run its schedules: each tick once
    deepx-flow ui [--port 5006]          # the dashboard, on 127.0.0.1
    deepx-flow onnx inspect|ops|run|export   # ONNX models: what they use, run, write graphs

`--db URL` (or DEEPX_DB_URL) picks the metadata database; the default is `.deepx/deepx.db`.

Exit codes: 0 success; 2 a bad graph, input file, cluster file, option or `DEEPX_*` setting
(one line, no traceback); 1 a failure while running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from deepx_flow.cli.named_paths import named_paths, report
from deepx_flow.config import settings
from deepx_flow.errors import DeepxError, InputError, PlanError
from deepx_flow.terminal_text import escaped, escaping_output

# The longest error line the command prints.
MESSAGE_CHARS = 1000


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 already; keep it to one line
        self.exit(2, f"deepx-flow: error: {message}\n")


def _version() -> str:
    """The installed distribution's version (the package's own when run from a checkout)."""
    from importlib import metadata
    try:
        return metadata.version("deepx-flow")
    except metadata.PackageNotFoundError:
        import deepx_flow
        return deepx_flow.__version__


def _parser() -> argparse.ArgumentParser:
    from deepx_flow.cli import (assets_cmd, gpu_cmd, onnx_cmd, registry_cmd, runs_cmd,
                                scheduler_cmd, serve_cmd, ui_cmd)

    parser = _Parser(prog="deepx-flow", description="Run tensor graphs on Dask clusters.")
    parser.add_argument("--version", action="version", version=f"deepx-flow {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", metavar="URL",
                    help="metadata database URL (default: DEEPX_DB_URL, else "
                         "sqlite:///.deepx/deepx.db)")

    run = sub.add_parser("run", help="run a YAML graph", parents=[db])
    run.add_argument("graph", help="YAML graph spec")
    run.add_argument("--input", "-i", action="append", metavar="NAME=PATH",
                     help="an input from a .npy file or a Zarr array (repeatable)")
    run.add_argument("--output", "-o", action="append", metavar="NAME=PATH",
                     help="write an output to a .npy file (repeatable); the names are the "
                          "spec's outputs")
    run.add_argument("--scheduler", metavar="ADDRESS",
                     help="use a running Dask scheduler instead of an embedded cluster")
    run.add_argument("--cluster", metavar="FILE", help="plan with this cluster file")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="show a progress bar once a run has taken 2 s (default: in a "
                          "terminal)")

    explain = sub.add_parser("explain", help="print the plan of a YAML graph", parents=[db])
    explain.add_argument("graph", help="YAML graph spec")
    explain.add_argument("--cluster", metavar="FILE",
                         help="plan for this cluster file (default: this machine)")
    explain.add_argument("--scheduler", metavar="ADDRESS",
                         help="plan for the cluster behind this scheduler")

    sub.add_parser("ops", help="list the operators, their engines and their measured speeds, "
                          "and the functions built from them",
                   parents=[db])
    runs_cmd.add_parsers(sub, [db])
    registry_cmd.add_parser(sub, [db])
    assets_cmd.add_parsers(sub, [db])
    scheduler_cmd.add_parser(sub, [db])
    ui_cmd.add_parser(sub, [db])
    onnx_cmd.add_parser(sub, [db])
    gpu_cmd.add_parser(sub, [db])
    serve_cmd.add_parser(sub, [db])
    return parser


def _read_graph(path: str):
    """The graph of a spec file, with the arrays its `read_zarr` nodes read checked (they
    must exist with the shape and dtype stated), before any cluster is started or contacted.
    Every error names the file."""
    from deepx_flow.runtime.inputs import check_stored_arrays
    from deepx_flow.spec.yaml_io import from_yaml

    graph = from_yaml(Path(path))
    try:
        return check_stored_arrays(graph)
    except InputError as err:
        raise InputError(f"{path}: {err}") from None


@contextlib.contextmanager
def _about(path: str):
    """A graph that cannot be planned is a fault of the spec: name its file."""
    try:
        yield
    except PlanError as err:
        raise PlanError(f"{path}: {err}") from None


def _cmd_run(args) -> int:
    from deepx_flow.runtime.progress import RunProgress, wanted
    from deepx_flow.runtime.run import run_graph

    if args.db:  # the run records itself where the settings say
        os.environ["DEEPX_DB_URL"] = args.db
    graph = _read_graph(args.graph)
    inputs = named_paths(args.input, "input")
    outputs = named_paths(args.output, "output")
    names = [name for name, _ in graph.outputs]
    unknown = sorted(set(outputs) - set(names))
    if unknown:
        raise InputError(f"--output names {', '.join(unknown)}, but the spec's outputs are "
                         f"{', '.join(names)}")
    for name, path in outputs.items():
        parent = Path(path).parent
        if not parent.is_dir():
            raise InputError(f"--output {name}: folder {parent} does not exist")
    with _about(args.graph):
        # The run's id (and dashboard link) is printed as it starts, on stderr.
        progress = RunProgress(show=wanted(args.progress), announce=True)
        results = run_graph(graph, inputs=inputs, scheduler=args.scheduler, cluster=args.cluster,
                            progress=progress)
    for name in names:
        report(name, results[name], outputs.get(name))
    return 0


def _cmd_explain(args) -> int:
    from deepx_flow.runtime.run import cluster_spec
    from deepx_flow.compiler.compile import compile_graph

    if args.db:  # planning for a live cluster registers it there
        os.environ["DEEPX_DB_URL"] = args.db
    graph = _read_graph(args.graph)
    if args.scheduler:
        from deepx_flow.runtime.cluster import connect
        with connect(scheduler=args.scheduler) as client:
            spec = cluster_spec(None, client)
    else:
        spec = cluster_spec(args.cluster)
    from deepx_flow.train.step_plan import is_step, plan_step, step_inputs
    with _about(args.graph):
        # a training step's spec (`dx.to_yaml` of its graph): its parameters placed too
        plan = plan_step(graph, *step_inputs(graph), spec) if is_step(graph) else \
            compile_graph(graph, spec)
    print(plan.explain())
    return 0


def _cmd_ops(args) -> int:
    from deepx_flow.registry.operators import operator_table
    from deepx_flow.sdk.catalog import function_table
    print(operator_table())
    print("\n" + function_table())
    print("\n" + _measured_speeds(args.db))
    return 0


def _measured_speeds(url: str | None) -> str:
    """The measured speeds' table, or why there is none. Listing operators needs no
    database: a missing SQLite file is not created, an unusable database is said."""
    from sqlalchemy.engine import make_url

    from deepx_flow.meta import open_db
    from deepx_flow.meta.db import database_url
    from deepx_flow.registry.speeds import speed_table
    url = database_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database \
            and not Path(parsed.database).exists():
        return f"No operator speeds measured yet ({parsed.database} does not exist)."
    try:
        measured = speed_table(open_db(url))
    except DeepxError as err:
        return _one_line(f"No measured operator speeds: {err}")
    return measured or "No operator speeds measured yet: they are recorded as runs finish."


def main(argv: list[str] | None = None) -> int:
    # Whatever the command prints, control characters in names and messages are shown as
    # escapes, not acted on by the terminal (`terminal_text`).
    with escaping_output():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    from deepx_flow.cli import (assets_cmd, gpu_cmd, onnx_cmd, registry_cmd, runs_cmd,
                                scheduler_cmd, serve_cmd, ui_cmd)
    command = {"run": _cmd_run, "explain": _cmd_explain, "ops": _cmd_ops,
               "runs": runs_cmd.cmd_runs, "placement": runs_cmd.cmd_placement,
               "registry": registry_cmd.run, "assets": assets_cmd.cmd_assets,
               "materialize": assets_cmd.cmd_materialize,
               "scheduler": scheduler_cmd.run, "ui": ui_cmd.run,
               "onnx": onnx_cmd.run, "gpu": gpu_cmd.run, "serve": serve_cmd.run}[args.command]
    try:
        settings()  # every DEEPX_* variable checked, whatever the command reads
        return command(args)
    except DeepxError as err:
        print(_one_line(f"deepx-flow: {'error' if err.exit_code == 2 else 'failed'}: {err}"),
              file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("deepx-flow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`deepx-flow ops | head`): stop quietly, as
        # a process killed by SIGPIPE would, without Python's complaint when it flushes.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except Exception as err:  # a failure while running: one line, not a traceback
        print(_one_line(f"deepx-flow: failed: {type(err).__name__}: {err}"), file=sys.stderr)
        return 1


def _one_line(message: str) -> str:
    """The first line of a message, its control characters escaped (a carriage return in a
    name neither ends the line nor overwrites it), at most MESSAGE_CHARS long: messages show
    values shortened, and this bounds what any message can print."""
    line = escaped(message.split("\n", 1)[0])
    if len(line) > MESSAGE_CHARS:
        line = f"{line[:MESSAGE_CHARS - 40]}... ({len(line):,} characters in all)"
    return line


if __name__ == "__main__":
    sys.exit(main())
