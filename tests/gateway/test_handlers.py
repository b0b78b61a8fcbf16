"""The gateway's transport-free handlers: capabilities and graph analysis, against the
spec reader and the compiler they stand for."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from deepx_flow.errors import GraphError, SpecError
from deepx_flow.gateway import capabilities as caps
from deepx_flow.gateway.graphs import analyze, graph_of
from deepx_flow.ops import OPS
from deepx_flow.ops.table import operator_table
from deepx_flow.runtime.run import cluster_spec
from deepx_flow.spec.yaml_io import from_yaml

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.yaml"))


def test_capabilities_list_every_operator_and_hash_the_canonical_table():
    answer = caps.capabilities(caps.Limits())
    assert answer["protocol_version"] == "deepx.v1"
    # the operator table's, composites included; not the compiler's own (fused)
    table = operator_table()
    assert [o["name"] for o in answer["operators"]] == sorted(table)
    assert set(OPS) - set(table) == {"fused"}
    conv = next(o for o in answer["operators"] if o["name"] == "conv")
    assert conv["attributes"] == list(OPS["conv"].attrs) and conv["arity"] == OPS["conv"].arity
    clip = next(o for o in answer["operators"] if o["name"] == "clip")
    assert (clip["kind"], clip["arity"], clip["attributes"]) == ("composite", 1, ["lo", "hi"])
    bare = [{k: v for k, v in o.items() if k != "description"} for o in answer["operators"]]
    text = json.dumps(bare, sort_keys=True, separators=(",", ":"))
    assert answer["operator_table_hash"] == hashlib.sha256(text.encode()).hexdigest()
    # any change of what a graph may use changes the hash; rewording a description does not
    changed = [dict(o) for o in answer["operators"]]
    changed[0]["attributes"] = changed[0]["attributes"] + ["extra"]
    assert caps.table_hash(changed) != answer["operator_table_hash"]
    reworded = [dict(o) for o in answer["operators"]]
    reworded[0]["description"] += " (reworded)"
    assert caps.table_hash(reworded) == answer["operator_table_hash"]
    assert answer["limits"]["max_message_bytes"] == 4 << 20
    assert "FP32" in answer["datatypes"] and "BYTES" not in answer["datatypes"]


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.stem)
def test_every_example_graph_reads_from_json_as_from_yaml(path):
    doc = yaml.safe_load(path.read_text())
    assert graph_of(json.dumps(doc), 100_000) == from_yaml(path)
    assert graph_of(doc, 100_000) == from_yaml(path)


def test_analysis_names_inputs_outputs_and_the_plan():
    doc = {"deepx": 1, "inputs": {"x": {"shape": [4, 3], "dtype": "float32"}},
           "nodes": [{"id": "y", "op": "mul", "args": ["x", 2]},
                     {"id": "s", "op": "sum", "args": ["y"], "attrs": {"axes": [1]}}],
           "outputs": ["s"]}
    graph = graph_of(doc, 100)
    answer = analyze(graph, cluster_spec())
    assert answer["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [4, 3]}]
    assert answer["outputs"] == [{"name": "s", "datatype": "FP32", "shape": [4]}]
    assert "Plan for cluster" in answer["plan"] and answer["tasks"] >= 1
    assert answer["nodes"] == len(graph) == 4  # the literal 2 is a node too


def test_an_integer_literal_stays_an_integer():
    """The reason graphs travel as JSON text, not protobuf Structs (doubles only)."""
    doc = {"deepx": 1, "inputs": {"x": {"shape": [2], "dtype": "int32"}},
           "nodes": [{"id": "y", "op": "add", "args": ["x", 1]}], "outputs": ["y"]}
    assert graph_of(json.dumps(doc), 10)["y"].dtype == "int32"
    doc["nodes"][0]["args"][1] = 1.0
    assert graph_of(json.dumps(doc), 10)["y"].dtype == np.dtype("float64").name


@pytest.mark.parametrize("spec, error, says", [
    ("{", SpecError, "not JSON"),
    ("[" * 100_000 + "]" * 100_000, SpecError, "nested too deep"),
    (b"\xff", SpecError, "not JSON"),
    ("[1]", SpecError, "not a spec object"),
    ('{"deepx": 1, "nodes": [], "outputs": ["y"]}', SpecError, "y"),
    ('{"deepx": 1, "inputs": {"x": {"shape": [2], "dtype": "float32"}}, "nodes": '
     '[{"id": "y", "op": "reul", "args": ["x"]}], "outputs": ["y"]}', GraphError, "reul"),
])
def test_bad_graphs_are_one_spec_or_graph_error(spec, error, says):
    with pytest.raises(error, match=says):
        graph_of(spec, 100)


def test_a_graph_over_the_node_limit_is_refused_before_it_is_read():
    doc = {"deepx": 1, "inputs": {"x": {"shape": [2], "dtype": "float32"}},
           "nodes": [{"id": f"n{i}", "op": "neg", "args": ["x"]} for i in range(20)],
           "outputs": ["n0"]}
    with pytest.raises(SpecError, match="21 inputs and nodes, over the limit of 10"):
        graph_of(doc, 10)
