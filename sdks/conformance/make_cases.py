"""Write the conformance suite's cases (`cases/*.json`), one per operator of the table (but
`input`, which every case uses, and `read_zarr`, which needs a store), one per dtype on the
wire (its edge values: least, greatest, NaN, infinities, -0.0, compared exactly) and an
empty tensor, from Python's SDK:
the steps any SDK takes through its public API, the canonical graph spec those steps must
give, inputs, and the outputs Python computes for them (`dx.run`, in process).

    python sdks/conformance/make_cases.py          # write them
    python sdks/conformance/make_cases.py --check  # exit 1 where they are not current

A case (JSON):
  name      the case's name
  steps     [{"input": name, "shape": [...], "dtype": d}
             | {"op": name, "args": [tensor id or number, ...], "attrs": {...},
                "shape": [...]?, "dtype": d?, "id": id}]
            each op step is the SDK's method of that name (generated from the operator
            table), called on the tensors its args name, with the attributes, the stated
            shape and dtype where given, and the id
  outputs   [[name, tensor id], ...]: graph.output(tensor, name), in order
  spec      the graph spec the steps give (docs/sdks.md says how the SDKs write it)
  inputs    {name: {"dtype", "shape", "data"}}: flat values (int64 and uint64 as decimal
            strings; float16 and bfloat16 as their 16-bit patterns, with "encoding": "bits")
  expected  {name: {"dtype", "shape", "data"}}: the same form; non-finite floats as
            "NaN", "Infinity", "-Infinity"
  rtol, atol  how close each SDK's results must be (the gateway computes them, so they
            match but for the order of float sums)
  error     instead of spec and expected where the case is a mistake: {"at": "build",
            "kind", "message"} (the SDK refuses the last step, in Python's words) or {"at":
            "run", "kind", "contains"} (the gateway refuses the run; its message holds
            "contains": the whole message Python gives)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import InputError  # noqa: E402
from deepx_flow.ops.table import operator_table  # noqa: E402
from deepx_flow.runtime.inputs import bind_inputs  # noqa: E402
from deepx_flow.spec.reader import document_to_graph  # noqa: E402

F = ([2, 3], "float32")
IMAGE = ([2, 3, 4, 4], "float32")
MATRIX = ([4, 5], "float32")
# operands (name -> (shape, dtype)), attributes and stated fields for one use of each
USES = {
    "where": ({"cond": ([2, 3], "bool"), "a": F, "b": F}, {}),
    "matmul": ({"a": ([2, 3], "float32"), "b": ([3, 4], "float32")}, {}),
    "concat": ({"t0": F, "t1": F}, {"axis": 1}),
    "take": ({"x": ([4, 3], "float32"), "indices": ([2], "int64")}, {"axis": 0}),
    "gather_elements": ({"x": F, "indices": ([2, 3], "int64")}, {"axis": 1}),
    "gather_nd": ({"x": F, "indices": ([1, 1], "int64")}, {}),
    "scatter_elements": ({"x": F, "indices": ([2, 3], "int64"), "updates": F},
                         {"axis": 1, "reduction": "add"}),
    "scatter_nd": ({"x": F, "indices": ([1, 1], "int64"), "updates": ([1, 3], "float32")},
                   {}),
    "conv": ({"x": IMAGE, "w": ([2, 3, 3, 3], "float32")}, {"pads": [1, 1, 1, 1]}),
    "max_pool": ({"x": IMAGE}, {"kernel": [2, 2], "strides": [2, 2]}),
    "avg_pool": ({"x": IMAGE}, {"kernel": [3, 3], "pads": [1, 1, 1, 1]}),
    "sum": ({"x": F}, {"axes": [1]}), "mean": ({"x": F}, {"keepdims": True}),
    "prod": ({"x": F}, {"axes": [0]}), "max": ({"x": F}, {"axes": [1]}),
    "min": ({"x": F}, {}), "softmax": ({"x": F}, {"axis": 1}),
    "log_softmax": ({"x": F}, {}), "cumsum": ({"x": F}, {"axis": 1, "reverse": True}),
    "transpose": ({"x": F}, {"axes": [1, 0]}),
    "slice": ({"x": F}, {"starts": [0, 1], "stops": [2, 3]}),
    "flip": ({"x": F}, {"axes": [1]}),
    "full": ({}, {"value": 2.5}), "arange": ({}, {"start": 1, "step": 2}),
    "random_normal": ({}, {"seed": 7}), "random_uniform": ({}, {"seed": 7, "low": -1.0}),
    "argmax": ({"x": MATRIX}, {"axis": 1}),
    "argmin": ({"x": MATRIX}, {"axis": 0, "keepdims": True}),
    "clip": ({"x": MATRIX}, {"lo": 0.7, "hi": 1.2}),
    "pad": ({"x": MATRIX}, {"widths": [[1, 0], [0, 2]], "mode": "reflect"}),
    "take_along_axis": ({"x": MATRIX, "indices": ([4, 2], "int64")}, {"axis": 1}),
    "scatter": ({"x": MATRIX, "indices": ([4, 2], "int64"), "updates": ([4, 2], "float32")},
                {"axis": 1, "reduction": "add"}),
    "scatter_add": ({"x": MATRIX, "indices": ([4, 2], "int64"),
                     "updates": ([4, 2], "float32")}, {"axis": 1}),
    "prelu": ({"x": IMAGE, "slope": ([3, 1, 1], "float32")}, {}),
    "conv_transpose": ({"x": IMAGE, "w": ([3, 2, 3, 3], "float32"), "b": ([2], "float32")},
                       {"stride": [2, 2], "padding": [1, 1, 1, 1]}),
    "batch_norm": ({"x": IMAGE, "scale": ([3], "float32"), "bias": ([3], "float32"),
                    "mean": ([3], "float32"), "var": ([3], "float32")}, {"eps": 0.001}),
    "layer_norm": ({"x": MATRIX, "scale": ([5], "float32")}, {}),
    "instance_norm": ({"x": IMAGE, "scale": ([3], "float32"), "bias": ([3], "float32")}, {}),
    "group_norm": ({"x": IMAGE, "scale": ([3], "float32"), "bias": ([3], "float32")},
                   {"groups": 3}),
    "one_hot": ({"labels": ([4], "int64")}, {"classes": 6}),
    "cross_entropy": ({"logits": MATRIX, "labels": ([4], "int64")}, {"reduction": "sum"}),
    "mse": ({"predictions": MATRIX, "targets": MATRIX}, {}),
    "dropout": ({"x": MATRIX}, {"rate": 0.25, "seed": 7, "step": 3}),
    "global_avg_pool": ({"x": IMAGE}, {}), "global_max_pool": ({"x": IMAGE}, {}),
}
STATED = {"full": ([2, 2], "float32"), "arange": ([4], "int64"),
          "random_normal": ([3], "float32"), "random_uniform": ([3], "float64"),
          "reshape": ([3, 2], None), "cast": (None, "float64"),
          "zeros": ([2, 3], "float64"), "ones": ([3], None), "one_hot": (None, "float64")}
SKIPPED = {"input", "read_zarr"}


def _values(shape, dtype, rng) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "int64":  # (indices: valid along the axis they address, labels: classes)
        return rng.integers(0, 2, shape).astype(np.int64)
    return rng.uniform(0.5, 1.5, shape).astype(dtype)


def _wire(array: np.ndarray) -> dict:
    flat = array.ravel()
    if array.dtype.name in ("float16", "bfloat16"):  # (their 16-bit patterns, exactly)
        return {"dtype": array.dtype.name, "shape": list(array.shape),
                "data": flat.view(np.uint16).tolist(), "encoding": "bits"}
    if array.dtype.kind == "f":
        data = [v if math.isfinite(v) else ("NaN" if math.isnan(v) else
                                            "Infinity" if v > 0 else "-Infinity")
                for v in flat.astype(np.float64).tolist()]
    elif array.dtype in (np.int64, np.uint64):
        data = [str(v) for v in flat.tolist()]
    else:
        data = flat.tolist()
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": data}


def case(name: str) -> dict:
    op = operator_table()[name]
    operands, attrs = USES.get(name, ({n: F for n in op.input_names()
                                       if n not in op.optional_inputs()}, {}))
    rng = np.random.default_rng(sum(map(ord, name)))
    steps, inputs, spec_inputs = [], {}, {}
    for given, (shape, dtype) in operands.items():
        steps.append({"input": given, "shape": shape, "dtype": dtype})
        spec_inputs[given] = {"shape": shape, "dtype": dtype}
        inputs[given] = _values(shape, dtype, rng)
    step = {"op": name, "args": list(operands), "attrs": attrs, "id": "y"}
    node = {"id": "y", "op": name, "args": list(operands)}
    shape, dtype = STATED.get(name, (None, None))
    for field, value in (("shape", shape), ("dtype", dtype)):
        if value is not None:
            step[field] = node[field] = value
    if attrs:
        node["attrs"] = attrs
    spec = {"deepx": 1, "inputs": spec_inputs, "nodes": [node], "outputs": ["y"]}
    graph = document_to_graph(spec)
    got = dx.run(graph, inputs=inputs)
    return {"name": name, "steps": steps + [step], "outputs": [["y", "y"]], "spec": spec,
            "inputs": {n: _wire(a) for n, a in inputs.items()},
            "expected": {n: _wire(np.asarray(a)) for n, a in got.items()},
            "rtol": 1e-6, "atol": 1e-6}


# Every dtype on the wire, each with the values at its edges (its least and greatest, NaN,
# the infinities and -0.0 for floats): flipped on the gateway, so every value comes back, in
# another order.
def _edges(dtype: str) -> np.ndarray:
    import ml_dtypes
    if dtype == "bool":
        return np.array([True, False, True])
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        kind = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        info = ml_dtypes.finfo(kind)
        return np.array([float(info.min), float(info.max), float(info.tiny), np.nan, np.inf,
                         -np.inf, -0.0, 1.5, -2.25], dtype=kind)
    info = np.iinfo(dtype)
    return np.array([info.min, info.max, 0, 1, info.max // 3], dtype=dtype)


def dtype_case(dtype: str, shape=None) -> dict:
    values = _edges(dtype) if shape is None else np.zeros(shape, dtype=_edges(dtype).dtype)
    shape = list(values.shape)
    spec = {"deepx": 1, "inputs": {"x": {"shape": shape, "dtype": dtype}},
            "nodes": [{"id": "y", "op": "flip", "args": ["x"]}], "outputs": ["y"]}
    got = dx.run(document_to_graph(spec), inputs={"x": values})["y"]
    return {"name": f"dtype_{dtype}" if values.size else f"empty_{dtype}",
            "steps": [{"input": "x", "shape": shape, "dtype": dtype},
                      {"op": "flip", "args": ["x"], "attrs": {}, "id": "y"}],
            "outputs": [["y", "y"]], "spec": spec, "inputs": {"x": _wire(values)},
            "expected": {"y": _wire(np.asarray(got))}, "rtol": 0.0, "atol": 0.0}


def _build_error(name: str, op: str, args: list, attrs: dict) -> dict:
    """A case whose last step is a mistake an SDK must refuse as it builds, with the kind
    and message Python's reader gives for the same node."""
    from deepx_flow.errors import DeepxError
    spec = {"deepx": 1, "inputs": {"x": {"shape": [2, 3], "dtype": "float32"}},
            "nodes": [{"id": "y", "op": op, "args": args, "attrs": attrs}], "outputs": ["y"]}
    try:
        document_to_graph(spec)
    except DeepxError as err:
        refused = {"at": "build", "kind": type(err).__name__, "message": str(err)}
    else:
        raise AssertionError(f"{name}: Python takes it")
    return {"name": name, "steps": [{"input": "x", "shape": [2, 3], "dtype": "float32"},
                                    {"op": op, "args": args, "attrs": attrs, "id": "y"}],
            "outputs": [["y", "y"]], "error": refused}


def _run_error(name: str, given: dict) -> dict:
    """A case the gateway refuses when it runs: the kind, and its whole message, which the
    SDK's error must hold (the gateway checks the inputs with `bind_inputs`, as here)."""
    spec = {"deepx": 1, "inputs": {"x": {"shape": [2, 3], "dtype": "float32"},
                                   "z": {"shape": [3], "dtype": "float32"}},
            "nodes": [{"id": "y", "op": "add", "args": ["x", "z"]}], "outputs": ["y"]}
    inputs = {n: np.zeros(s, np.float32) for n, s in given.items()}
    try:
        bind_inputs(document_to_graph(spec), inputs)
    except InputError as err:
        message = str(err)
    else:
        raise AssertionError(f"{name}: Python takes it")
    return {"name": name, "steps": [{"input": "x", "shape": [2, 3], "dtype": "float32"},
                                    {"input": "z", "shape": [3], "dtype": "float32"},
                                    {"op": "add", "args": ["x", "z"], "attrs": {}, "id": "y"}],
            "outputs": [["y", "y"]], "spec": spec,
            "inputs": {n: _wire(v) for n, v in inputs.items()},
            "error": {"at": "run", "kind": "InputError", "contains": message}}


ERRORS = {
    "error_unknown_operator": lambda: _build_error("error_unknown_operator", "relux", ["x"], {}),
    "error_unknown_attribute": lambda: _build_error("error_unknown_attribute", "sum", ["x"],
                                                    {"axis": 1}),
    "error_missing_attribute": lambda: _build_error("error_missing_attribute", "one_hot",
                                                    ["x"], {}),
    "error_arity": lambda: _build_error("error_arity", "add", ["x"], {}),
    "error_composite_arity": lambda: _build_error("error_composite_arity", "leaky_relu",
                                                  ["x", "x"], {}),
    "error_missing_input": lambda: _run_error("error_missing_input", {"x": (2, 3)}),
    "error_bad_shape": lambda: _run_error("error_bad_shape", {"x": (2, 3), "z": (4,)}),
}

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64")


def cases() -> dict[str, str]:
    """Every case's file name -> its JSON text."""
    out = {}
    for name in operator_table():
        if name in SKIPPED:
            continue
        out[f"op_{name}.json"] = json.dumps(case(name), indent=1) + "\n"
    for dtype in DTYPES:
        out[f"dtype_{dtype}.json"] = json.dumps(dtype_case(dtype), indent=1) + "\n"
    out["empty_float32.json"] = json.dumps(dtype_case("float32", (0, 3)), indent=1) + "\n"
    for name, make in ERRORS.items():
        out[f"{name}.json"] = json.dumps(make(), indent=1) + "\n"
    return out


def same(stored: dict, made: dict) -> bool:
    """A stored case is the one made now: the same in every field, but that its expected
    values need only be as close as its tolerance (another machine's BLAS may sum in
    another order)."""
    if {k: v for k, v in stored.items() if k != "expected"} != \
            {k: v for k, v in made.items() if k != "expected"}:
        return False
    if "expected" not in made:
        return "expected" not in stored
    if stored["expected"].keys() != made["expected"].keys():
        return False
    for name, want in made["expected"].items():
        got = stored["expected"][name]
        if (got["dtype"], got["shape"]) != (want["dtype"], want["shape"]):
            return False
        a, b = (np.array([float(v) for v in t["data"]]) for t in (got, want))
        if not np.allclose(a, b, rtol=made["rtol"], atol=made["atol"], equal_nan=True):
            return False
    return True


def write_or_check(target: Path, made: dict[str, str], alike, argv) -> int:
    """Write `made` (file name -> text) into the folder `target`, removing other .json files;
    with --check in `argv`, write nothing and exit 1 naming the files that are not current
    (`alike(stored, made)` says whether a stored file is the one made now)."""
    if "--check" in argv:
        stale = [n for n, text in made.items()
                 if not (target / n).is_file() or
                 not alike(json.loads((target / n).read_text()), json.loads(text))]
        stale += [p.name for p in target.glob("*.json") if p.name not in made]
        if stale:
            print(f"not current (run python sdks/conformance/{Path(sys.argv[0]).name}): " +
                  ", ".join(sorted(stale)))
            return 1
        return 0
    target.mkdir(exist_ok=True)
    for old in target.glob("*.json"):
        if old.name not in made:
            old.unlink()
    for n, text in made.items():
        (target / n).write_text(text)
    return 0


def main(argv) -> int:
    return write_or_check(HERE / "cases", cases(), same, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
