"""`deepx-flow onnx`: inspect and run ONNX models from a shell.

    deepx-flow onnx inspect model.onnx       # opset, inputs, outputs, each operator supported?
    deepx-flow onnx ops                      # the ONNX operators deepx_flow converts
    deepx-flow onnx run model.onnx --input input=images.zarr --output logits=out.zarr
    deepx-flow onnx export graph.yaml model.onnx --input w=w.npy --dynamic-axis x:0:N

`run` reads each input from a Zarr array (chunk by chunk, on the workers) or a `.npy` file,
and writes each output to a new Zarr array from the workers (without gathering it here) or to
a `.npy` file (gathered). A model that cannot be converted, or an input that does not match
it, is exit code 2 with one line naming the ONNX node or the input.

`export` writes a YAML graph spec as an ONNX model (`dx.onnx.save`): the spec's outputs are
the model's, inputs given as `.npy` files become initializers, the others graph inputs, and
random sources (`random_normal` weights) initializers holding their values. A
spec that cannot be read or exported is exit code 2 with one line naming the file or node.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path


def add_parser(sub, parents) -> None:
    onnx = sub.add_parser("onnx", help="inspect, run and export ONNX models")
    verbs = onnx.add_subparsers(dest="onnx_command", required=True,
                                parser_class=type(onnx))
    inspect = verbs.add_parser("inspect", help="a model's opset, inputs, outputs and operators")
    inspect.add_argument("model", help="an .onnx file")
    verbs.add_parser("ops", help="the ONNX operators deepx_flow converts")
    run = verbs.add_parser("run", help="run a model on stored inputs", parents=parents)
    run.add_argument("model", help="an .onnx file")
    run.add_argument("--input", "-i", action="append", metavar="NAME=PATH",
                     help="a graph input from a Zarr array or a .npy file (repeatable)")
    run.add_argument("--output", "-o", action="append", metavar="NAME=PATH",
                     help="write an output to a new Zarr array (a path ending in .zarr, "
                          "written by the workers) or a .npy file (repeatable)")
    run.add_argument("--scheduler", metavar="ADDRESS",
                     help="use a running Dask scheduler instead of an embedded cluster")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="show a progress bar once a run has taken 2 s (default: in a "
                          "terminal)")
    export = verbs.add_parser("export", help="write a YAML graph as an ONNX model")
    export.add_argument("graph", help="a YAML graph spec")
    export.add_argument("model", help="the .onnx file to write")
    export.add_argument("--input", "-i", action="append", metavar="NAME=PATH",
                        help="bind an input to a .npy file: an initializer of the model "
                             "(repeatable)")
    export.add_argument("--opset", type=int, default=None,
                        help="the ONNX opset to write (default 18)")
    export.add_argument("--dynamic-axis", action="append", metavar="NAME:AXIS:SYMBOL",
                        help="an axis of a graph input that takes any size, e.g. x:0:N "
                             "(repeatable)")


def run(args) -> int:
    return {"inspect": _inspect, "ops": _ops, "run": _run,
            "export": _export}[args.onnx_command](args)


def _ops(args) -> int:
    from deepx_flow.onnx.converters import SUPPORTED
    from deepx_flow.text_table import text_table
    rows = [(name, op.family, ", ".join(op.attrs) or "-", op.doc or "-")
            for name, op in sorted(SUPPORTED.items())]
    print(text_table(("ONNX operator", "family", "attributes", "notes"), rows))
    return 0


def _inspect(args) -> int:
    from deepx_flow.errors import InputError, SpecError
    from deepx_flow.onnx.model import FIRST_OPSET, _onnx, _value_type
    from deepx_flow.onnx.converters import SUPPORTED
    from deepx_flow.text_table import text_table
    onnx = _onnx()
    path = args.model
    if not Path(path).is_file():
        raise InputError(f"ONNX model {path} does not exist")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as err:
        raise SpecError(f"{path}: not an ONNX model: {type(err).__name__}: {err}") from None
    graph = proto.graph
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in proto.opset_import)
    print(f"{path}: graph {graph.name!r}, {len(graph.node)} nodes, opsets {opsets} "
          f"(deepx_flow reads ai.onnx {FIRST_OPSET} to {onnx.defs.onnx_opset_version()}, and "
          f"older ones upgraded by onnx.version_converter)")
    initialized = {t.name for t in graph.initializer}
    rows = []
    for kind, infos in (("input", [i for i in graph.input if i.name not in initialized]),
                        ("output", graph.output)):
        for info in infos:
            try:
                dims, dtype = _value_type(info, info.name)
                shape = "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"
            except SpecError as err:
                dtype, shape = "unsupported", str(err).split(": ", 1)[-1]
            rows.append((kind, info.name, dtype, shape))
    print(text_table(("", "name", "dtype", "shape"), rows))
    counts = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                     for n in graph.node)
    table = [(op, str(n), "yes" if op in SUPPORTED else "no") for op, n in sorted(counts.items())]
    print(text_table(("operator", "nodes", "supported"), table))
    missing = [op for op, _, ok in table if ok == "no"]
    print(f"{len(initialized)} initializers; " + (
        f"not supported: {', '.join(missing)}" if missing else "every operator is supported"))
    return 0


def _run(args) -> int:
    import deepx_flow as dx
    from deepx_flow.cli.named_paths import named_paths, report
    from deepx_flow.errors import InputError
    from deepx_flow.onnx.model import identifier
    from deepx_flow.storage.readers import array_info as npy_info

    if args.db:
        os.environ["DEEPX_DB_URL"] = args.db
    model = dx.onnx.load(args.model)
    inputs, outputs = named_paths(args.input, "input"), named_paths(args.output, "output")
    unknown = sorted(set(outputs) - set(model.output_names))
    if unknown:
        raise InputError(f"--output names {', '.join(unknown)}, but the model's outputs are "
                         f"{', '.join(model.output_names)}")
    for name, path in outputs.items():
        if Path(path).exists():
            raise InputError(f"--output {name}: {path} exists already")
        if not Path(path).absolute().parent.is_dir():
            raise InputError(f"--output {name}: folder {Path(path).parent} does not exist")
    given, feed = {}, {}
    for name, path in inputs.items():
        if path.rstrip("/").endswith(".zarr") or Path(path, "zarr.json").exists():
            given[name] = dx.read_zarr(path)
        else:
            if not Path(path).is_file():
                raise InputError(f"--input {name}: {path} does not exist")
            shape, dtype = npy_info(path)  # its header, read (a map of a file cut short
            # while it is read is a SIGBUS)
            key = identifier(name)
            given[name] = dx.input(key, shape, dtype)
            feed[key] = path
    results = model(given)
    wanted = [n for n in model.output_names if n in outputs] or model.output_names
    bound = feed  # the model's weights travel with its tensors
    to_zarr = [n for n in wanted if outputs.get(n, "").rstrip("/").endswith(".zarr")]
    if to_zarr:
        from deepx_flow.storage.zarr_store import write_persisted
        persisted = dx.persist([results[n] for n in to_zarr], inputs=bound,
                               scheduler=args.scheduler)
        for name, p in zip(to_zarr, persisted):
            info = write_persisted(p, outputs[name])
            print(f"{name}: shape {tuple(info['shape'])} {info['dtype']} -> {info['uri']}")
    rest = [n for n in wanted if n not in to_zarr]
    if rest:
        from deepx_flow.runtime.progress import RunProgress
        from deepx_flow.runtime.progress import wanted as shown
        values = dx.run([results[n] for n in rest], inputs=bound, scheduler=args.scheduler,
                        progress=RunProgress(show=shown(args.progress), announce=True))
        for name, value in zip(rest, values):
            report(name, value, outputs.get(name))
    return 0


def _export(args) -> int:
    import numpy as np

    import deepx_flow as dx
    from deepx_flow.cli.named_paths import named_paths
    from deepx_flow.errors import InputError, SpecError
    from deepx_flow.spec.yaml_io import from_yaml

    graph = from_yaml(Path(args.graph))
    weights = {}
    for name, path in named_paths(args.input, "input").items():
        if not Path(path).is_file():
            raise InputError(f"--input {name}: {path} does not exist")
        try:
            weights[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise InputError(f"--input {name}: {path} is not a .npy file: {err}") from None
    dynamic: dict[str, dict[int, str]] = {}
    for value in args.dynamic_axis or []:
        name, axis, symbol = (value.split(":") + ["", ""])[:3]
        if not name or not axis.lstrip("-").isdigit() or not symbol:
            raise InputError(f"--dynamic-axis expects NAME:AXIS:SYMBOL (x:0:N), got {value!r}")
        dynamic.setdefault(name, {})[int(axis)] = symbol
    try:
        path = dx.onnx.save(graph, args.model, inputs=weights, opset=args.opset,
                            dynamic_axes=dynamic or None)
    except SpecError as err:
        raise SpecError(f"{args.graph}: {err}") from None
    free = [n.id for n in graph.inputs if n.id not in weights]
    drawn = [n.id for n in graph.nodes if n.op in ("random_normal", "random_uniform")]
    print(f"{path}: {len(graph.nodes)} nodes of {args.graph}, graph inputs "
          f"{', '.join(free) or 'none'}, {len(weights) + len(drawn)} initializers"
          f"{f' ({len(drawn)} random)' if drawn else ''}, outputs "
          f"{', '.join(name for name, _ in graph.outputs)}")
    return 0
