"""Write the conformance suite's scenarios (`scenarios/*.json`): what a case of one graph
cannot show, each a list of calls an SDK makes in order against the gateway, with what each
must give. Expected values come from Python (`dx.run` in process, NumPy for the model).

    python sdks/conformance/make_scenarios.py          # write them
    python sdks/conformance/make_scenarios.py --check  # exit 1 where they are not current

A scenario (JSON): {"name", "scenario": [call, ...]}. Before reading one, a runner replaces
every `{prefix}` in its text with `<language>_<transport>_`, so that the languages' assets,
which one gateway keeps, are their own. A graph in a call is {"steps", "outputs", "spec"} as
in a case (built through the SDK's public API, and its spec must equal "spec"). A tensor is
{"dtype", "shape", "data"} as in a case, or {"dtype", "shape", "pattern": {"modulo": m,
"scale": s}}: value i is (i mod m) * s, for tensors too large to store (past gRPC's 4 MiB
message limit: the gateway and the SDKs stream them). The calls ("do"):

  define_asset   {"asset", "graph"}: define the asset computed by the graph
  materialize    {"asset", "state"}: materialize it; the operation ends in that state
  read_asset     {"asset", "expected", "rtol", "atol"}: its newest version
  list_assets    {"includes": [name, ...]}: the assets listed include these
  asset_versions {"asset", "at_least"}: it has at least that many stored versions
  execute        {"graph", "inputs", "expected", "rtol", "atol", "follow"}: run it; with
                 "follow", start it without waiting and ask for the operation again (waiting
                 at most a second each time) until it is not "running"; then it succeeded,
                 its progress says tasks_done == tasks_total > 0, its dashboard link ends
                 with "/run?id=" + its run id, the run (get run) is "succeeded" and the
                 list of runs (limit 100) holds it
  infer          {"model", "inputs", "expected", "rtol", "atol"} or {"model", "inputs",
                 "error": {"kind", "contains"}}: call a served model (the Open Inference
                 Protocol); run.sh serves model.py's `classifier`
  cancel         {"graph", "inputs"}: start it without waiting, cancel it: the operation
                 is "interrupted", its error says "cancelled", and its run is "interrupted"
  check_server   {"protocol_version", "operator_table_hash"}: the SDK carries these (its
                 generated code) and its check of the gateway's capabilities passes
  analyze        {"graph", "analysis": {"inputs", "outputs"}}: the gateway's analysis of the
                 graph lists these inputs and outputs ({"name", "datatype", "shape"} each,
                 in order), a plan (non-empty text) and at least one task
  cancel_ended   {"graph", "inputs"}: run it to its end, then cancel it: that changes
                 nothing (the operation is "succeeded" and the answer has no outputs), and
                 asked for again the operation still has them
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import model  # noqa: E402
from make_cases import _wire, same, write_or_check  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.spec.reader import document_to_graph  # noqa: E402

PREFIX = "{prefix}"


def graph_of(spec: dict) -> dict:
    """A graph as a scenario holds it: the steps an SDK takes to build `spec`, and the spec."""
    steps = [{"input": name, "shape": i["shape"], "dtype": i["dtype"]}
             for name, i in spec["inputs"].items()]
    for node in spec["nodes"]:
        step = {"op": node["op"], "args": node["args"], "attrs": node.get("attrs", {}),
                "id": node["id"]}
        step.update({f: node[f] for f in ("shape", "dtype") if f in node})
        steps.append(step)
    outputs = [[o, o] if isinstance(o, str) else list(o.items())[0] for o in spec["outputs"]]
    return {"steps": steps, "outputs": outputs, "spec": spec}


def computed(spec: dict, inputs: dict) -> dict:
    """What `spec` gives for `inputs`, run here (with a prefix of Python's own)."""
    text = json.dumps(spec).replace(PREFIX, "python_")
    inputs = {k.replace(PREFIX, "python_"): v for k, v in inputs.items()}
    return {k.replace("python_", PREFIX): np.asarray(v)
            for k, v in dx.run(document_to_graph(json.loads(text)), inputs=inputs).items()}


def assets() -> dict:
    numbers = {"deepx": 1, "inputs": {}, "outputs": ["numbers"], "nodes": [
        {"id": "numbers", "op": "arange", "args": [], "shape": [6], "dtype": "float32",
         "attrs": {"start": 1.0, "step": 0.5}}]}
    scaled = {"deepx": 1, "inputs": {f"{PREFIX}numbers": {"shape": [6], "dtype": "float32"}},
              "nodes": [{"id": "tripled", "op": "mul", "args": [f"{PREFIX}numbers", 3.0]},
                        {"id": "scaled", "op": "add", "args": ["tripled", 1.0]}],
              "outputs": ["scaled"]}
    made = computed(numbers, {})["numbers"]
    want = computed(scaled, {f"{PREFIX}numbers": made})["scaled"]
    return {"name": "assets", "scenario": [
        {"do": "define_asset", "asset": f"{PREFIX}numbers", "graph": graph_of(numbers)},
        {"do": "define_asset", "asset": f"{PREFIX}scaled", "graph": graph_of(scaled)},
        {"do": "materialize", "asset": f"{PREFIX}numbers", "state": "succeeded"},
        {"do": "materialize", "asset": f"{PREFIX}scaled", "state": "succeeded"},
        {"do": "read_asset", "asset": f"{PREFIX}numbers", "expected": _wire(made),
         "rtol": 0.0, "atol": 0.0},
        {"do": "read_asset", "asset": f"{PREFIX}scaled", "expected": _wire(want),
         "rtol": 1e-6, "atol": 1e-6},
        {"do": "list_assets", "includes": [f"{PREFIX}numbers", f"{PREFIX}scaled"]},
        {"do": "asset_versions", "asset": f"{PREFIX}scaled", "at_least": 1}]}


def follow() -> dict:
    spec = {"deepx": 1, "inputs": {"x": {"shape": [4, 5], "dtype": "float64"}},
            "nodes": [{"id": "e", "op": "exp", "args": ["x"]},
                      {"id": "total", "op": "sum", "args": ["e"], "attrs": {"axes": [1]}}],
            "outputs": ["total"]}
    x = np.random.default_rng(7).standard_normal((4, 5))
    return {"name": "follow_a_run", "scenario": [
        {"do": "execute", "graph": graph_of(spec), "inputs": {"x": _wire(x)},
         "expected": {n: _wire(a) for n, a in computed(spec, {"x": x}).items()},
         "rtol": 1e-12, "atol": 0.0, "follow": True}]}


def pattern(dtype: str, shape: list, modulo: int, scale: float) -> tuple[dict, np.ndarray]:
    values = (np.arange(int(np.prod(shape))) % modulo * scale).astype(dtype).reshape(shape)
    return {"dtype": dtype, "shape": shape,
            "pattern": {"modulo": modulo, "scale": scale}}, values


def large() -> dict:
    """A tensor each way past gRPC's 4 MiB message limit (4.8 MB: streamed in chunks there)."""
    shape = [1_200_000]
    given, x = pattern("float32", shape, 1000, 0.5)
    spec = {"deepx": 1, "inputs": {"x": {"shape": shape, "dtype": "float32"}},
            "nodes": [{"id": "doubled", "op": "mul", "args": ["x", 2.0]},
                      {"id": "total", "op": "sum", "args": ["x"]}],
            "outputs": ["doubled", "total"]}
    got = computed(spec, {"x": x})
    want_doubled, doubled = pattern("float32", shape, 1000, 1.0)
    assert np.array_equal(got["doubled"], doubled)
    return {"name": "large_tensors", "scenario": [
        {"do": "execute", "graph": graph_of(spec), "inputs": {"x": given},
         "expected": {"doubled": want_doubled, "total": _wire(got["total"])},
         # (a float32 sum of 1.2 million terms, in the cluster's order)
         "rtol": 1e-5, "atol": 0.0, "follow": False}]}


def two_large() -> dict:
    """Two tensors each way of 2.5 MB: each under gRPC's 4 MiB message limit, together
    over it (one is inline, the other streamed, both ways)."""
    shape = [625_000]
    given_a, a = pattern("float32", shape, 1000, 1.0)
    given_b, b = pattern("float32", shape, 7, 0.25)
    spec = {"deepx": 1, "inputs": {"a": {"shape": shape, "dtype": "float32"},
                                   "b": {"shape": shape, "dtype": "float32"}},
            "nodes": [{"id": "a2", "op": "mul", "args": ["a", 2.0]},
                      {"id": "b4", "op": "mul", "args": ["b", 4.0]}],
            "outputs": ["a2", "b4"]}
    got = computed(spec, {"a": a, "b": b})
    want_a2, a2 = pattern("float32", shape, 1000, 2.0)
    want_b4, b4 = pattern("float32", shape, 7, 1.0)
    assert np.array_equal(got["a2"], a2) and np.array_equal(got["b4"], b4)
    return {"name": "two_large_tensors", "scenario": [
        {"do": "execute", "graph": graph_of(spec), "inputs": {"a": given_a, "b": given_b},
         "expected": {"a2": want_a2, "b4": want_b4}, "rtol": 0.0, "atol": 0.0,
         "follow": False}]}


def analyze() -> dict:
    """Shapes and dtypes the gateway works out (a matmul, a sum, a cast) and its plan."""
    from deepx_flow.gateway.graphs import analyze as analyzed, graph_of as read
    from deepx_flow.registry.cluster import local_cluster_spec
    spec = {"deepx": 1, "inputs": {"a": {"shape": [3, 4], "dtype": "float32"},
                                   "b": {"shape": [4, 5], "dtype": "float32"}},
            "nodes": [{"id": "ab", "op": "matmul", "args": ["a", "b"]},
                      {"id": "rows", "op": "sum", "args": ["ab"], "attrs": {"axes": [1]}},
                      {"id": "wide", "op": "cast", "args": ["rows"], "dtype": "float64"}],
            "outputs": ["ab", {"total": "wide"}]}
    answer = analyzed(read(spec, 100), local_cluster_spec())
    assert answer["plan"] and answer["tasks"] >= 1
    return {"name": "analyze", "scenario": [
        {"do": "analyze", "graph": graph_of(spec),
         "analysis": {"inputs": answer["inputs"], "outputs": answer["outputs"]}}]}


def cancel_ended() -> dict:
    spec = {"deepx": 1, "inputs": {"x": {"shape": [3], "dtype": "float32"}},
            "nodes": [{"id": "y", "op": "neg", "args": ["x"]}], "outputs": ["y"]}
    return {"name": "cancel_ended", "scenario": [
        {"do": "cancel_ended", "graph": graph_of(spec),
         "inputs": {"x": _wire(np.array([1.5, -2.0, 0.0], np.float32))}}]}


def infer() -> dict:
    x = np.random.default_rng(11).standard_normal((5, 4)).astype(np.float32)
    want = model.answer(x.astype(np.float64)).astype(np.float32)
    return {"name": "served_model", "scenario": [
        {"do": "infer", "model": model.NAME, "inputs": {"x": _wire(x)},
         "expected": {"y": _wire(want)}, "rtol": 1e-5, "atol": 1e-6},
        {"do": "infer", "model": "no_such_model", "inputs": {"x": _wire(x)},
         "error": {"kind": "NotFound", "contains": "no_such_model"}}]}


def cancel() -> dict:
    """A graph of minutes (twenty 4096 x 4096 matmuls, each a fixed point: (J/n)(J/n) =
    J/n), cancelled as it starts."""
    n = 4096
    nodes = [{"id": "a", "op": "full", "args": [], "shape": [n, n], "dtype": "float32",
              "attrs": {"value": 1.0 / n}}]
    for i in range(20):
        nodes.append({"id": f"m{i}", "op": "matmul", "args": [nodes[-1]["id"], "a"]})
    spec = {"deepx": 1, "inputs": {}, "nodes": nodes,
            "outputs": [{"slow": nodes[-1]["id"]}]}
    return {"name": "cancel", "scenario": [
        {"do": "cancel", "graph": graph_of(spec), "inputs": {}}]}


def check_server() -> dict:
    from deepx_flow.gateway.capabilities import PROTOCOL_VERSION, operator_table, table_hash
    return {"name": "check_server", "scenario": [
        {"do": "check_server", "protocol_version": PROTOCOL_VERSION,
         "operator_table_hash": table_hash(operator_table())}]}


def scenarios() -> dict[str, str]:
    """Every scenario's file name -> its JSON text."""
    return {f"{s['name']}.json": json.dumps(s, indent=1) + "\n"
            for s in (assets(), follow(), large(), two_large(), infer(), cancel(),
                      cancel_ended(), check_server(), analyze())}


def _same(stored: dict, made: dict) -> bool:
    """A stored scenario is the one made now: the same in every field, but that computed
    values need only be as close as the call's tolerance (another machine's BLAS)."""
    def without_expected(s):
        return [{k: v for k, v in c.items() if k != "expected"} for c in s["scenario"]]
    if stored.get("name") != made.get("name") or without_expected(stored) != \
            without_expected(made):
        return False
    for got, want in zip(stored["scenario"], made["scenario"]):
        if "expected" not in want:
            continue
        one = "dtype" in want["expected"]  # (read_asset: one tensor, not a dict of them)
        pairs = [(got.get("expected"), want["expected"])] if one else \
            [(got.get("expected", {}).get(n), t) for n, t in want["expected"].items()]
        for a, b in pairs:
            if a is None or "pattern" in b or "pattern" in a:
                if a != b:
                    return False
            else:
                tolerance = {"rtol": want["rtol"], "atol": want["atol"]}
                if not same({"expected": {"t": a}, **tolerance},
                            {"expected": {"t": b}, **tolerance}):
                    return False
    return True


def main(argv) -> int:
    return write_or_check(HERE / "scenarios", scenarios(), _same, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
