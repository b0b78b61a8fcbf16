"""Malformed specs: each is refused with the right exception, naming the node (or file) and
saying what is wrong."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deepx_flow.errors import GraphError, SpecError
from deepx_flow.spec.yaml_io import from_yaml

HEADER = "deepx: 1\ninputs:\n  x: {shape: [200, 512], dtype: float32}\n"


def spec(nodes: str, outputs: str = "[h]", header: str = HEADER) -> str:
    return header + "nodes:\n" + textwrap.indent(textwrap.dedent(nodes).strip(), "  ") + \
        f"\noutputs: {outputs}\n"


def refused(text: str, cls: type[Exception]) -> Exception:
    """The error from_yaml raises for `text`, which must be exactly of class `cls`."""
    with pytest.raises(GraphError) as info:
        from_yaml(text)
    assert type(info.value) is cls, f"{type(info.value).__name__}: {info.value}"
    return info.value


def test_bad_yaml_gives_the_line():
    err = refused("deepx: 1\nnodes:\n  - {id: a, op: exp\noutputs: [a]\n", SpecError)
    assert "invalid YAML" in str(err) and "line 4" in str(err)
    # The brace that was never closed opened on line 3.
    assert "starts at line 3" in str(err)


def test_bad_yaml_in_a_file_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("deepx: 1\ninputs:\n  x: {shape: [2], dtype: float32\n  y: 1\n")
    with pytest.raises(SpecError) as info:
        from_yaml(path)
    assert str(info.value).startswith(f"{path}: line ")
    assert "invalid YAML" in str(info.value)


@pytest.mark.parametrize("text,words", [
    ("", ["empty"]),
    ("- deepx: 1\n- outputs: [x]\n", ["must be a YAML mapping", "list"]),
    ("just words\n", ["must be a YAML mapping", "string"]),
])
def test_top_level_must_be_a_mapping(text, words):
    err = refused(text, SpecError)
    assert all(w in str(err) for w in words), str(err)


@pytest.mark.parametrize("version,words", [
    (None, ["missing the version", "deepx: 1"]),
    ("2", ["unsupported spec version 2", "deepx: 1"]),
    ("'1'", ["unsupported spec version '1'"]),
    ("true", ["unsupported spec version True"]),
    ("1.0", ["unsupported spec version 1.0"]),
])
def test_version_is_required_and_checked(version, words):
    text = spec("- {id: h, op: exp, args: [x]}")
    text = text.replace("deepx: 1\n", "" if version is None else f"deepx: {version}\n")
    err = refused(text, SpecError)
    assert all(w in str(err) for w in words), str(err)


def test_unknown_top_level_key_is_refused_with_a_suggestion():
    err = refused(spec("- {id: h, op: exp, args: [x]}").replace("nodes:", "node:"), SpecError)
    assert "unknown top-level key 'node'" in str(err) and "did you mean 'nodes'" in str(err)


def test_missing_outputs_is_refused():
    err = refused(HEADER, SpecError)
    assert "missing 'outputs'" in str(err)


@pytest.mark.parametrize("fields,words", [
    ("{dtype: float32}", ["input 'x'", "needs a shape"]),
    ("{shape: [3]}", ["input 'x'", "needs a dtype"]),
    ("{shape: [3], dtype: float32, chunks: 2}", ["input 'x'", "unknown key 'chunks'"]),
    ("{shape: 3, dtype: float32}", ["node 'x'", "shape must be a list of integers"]),
    ("[3, float32]", ["input 'x'", "must be a mapping"]),
])
def test_inputs_need_shape_and_dtype(fields, words):
    err = refused(f"deepx: 1\ninputs:\n  x: {fields}\noutputs: [x]\n", SpecError)
    assert all(w in str(err) for w in words), str(err)
    assert err.node == "x"


def test_unsupported_dtype():
    err = refused(spec("- {id: h, op: cast, args: [x], dtype: float8}"), GraphError)
    assert "node 'h'" in str(err) and "unsupported dtype 'float8'" in str(err)


def test_unknown_operator_names_the_node_and_suggests():
    err = refused(spec("- {id: h, op: matmull, args: [x, x]}"), GraphError)
    assert "node 'h'" in str(err) and "unknown operator 'matmull'" in str(err)
    assert "did you mean 'matmul'" in str(err)
    assert err.node == "h"


@pytest.mark.parametrize("node,words", [
    ("{id: h, op: sum, args: [x], attrs: {axis: 1}}",
     ["node 'h'", "no attribute 'axis'", "axes"]),
    ("{id: h, op: random_normal, shape: [2], dtype: float32, attrs: {mean: 1.0}}",
     ["node 'h'", "needs attribute 'seed'"]),
    ("{id: h, op: sum, args: [x], attrs: {axes: 2}}",
     ["node 'h'", "axis 2 is out of range for 2-D input"]),
    ("{id: h, op: sum, args: [x], attrs: {axes: [1, -1]}}", ["node 'h'", "repeated axis"]),
    ("{id: h, op: transpose, args: [x], attrs: {axes: [0, 0]}}",
     ["node 'h'", "permutation"]),
    ("{id: h, op: sum, args: [x], attrs: {axes: 1, keepdims: maybe}}",
     ["node 'h'", "keepdims must be true or false"]),
    ("{id: h, op: random_normal, shape: [2], dtype: int32, attrs: {seed: 0}}",
     ["node 'h'", "floating-point"]),
    ("{id: h, op: full, shape: [2], dtype: float32, attrs: {value: [1, 2]}}",
     ["node 'h'", "value must be a number"]),
    ("{id: h, op: reshape, args: [x], shape: [-1, -1]}",
     ["node 'h'", "only one dimension may be -1"]),
    ("{id: h, op: slice, args: [x], attrs: {starts: [0], stops: [1], steps: [1]}}",
     ["node 'h'", "one entry per axis"]),
])
def test_bad_attributes_name_the_node_and_problem(node, words):
    err = refused(spec(f"- {node}"), GraphError)
    assert all(w in str(err) for w in words), str(err)


@pytest.mark.parametrize("node,words", [
    ("{id: h, op: exp, arg: [x]}", ["node 'h'", "unknown key 'arg'", "did you mean 'args'"]),
    ("{id: h, op: sum, args: [x], axes: 1}", ["node 'h'", "attribute of sum", "under attrs"]),
    ("{op: exp, args: [x]}", ["nodes entry 1", "has no 'id'"]),
    ("{id: on, op: exp, args: [x]}", ["nodes entry 1", "not a string", "quote"]),
    ("{id: h, args: [x]}", ["node 'h'", "missing 'op'"]),
    ("{id: h, op: exp, args: x}", ["node 'h'", "'args' must be a list"]),
    ("{id: h, op: exp, args: [x, null]}", ["node 'h'", "node id or a number", "None"]),
    ("{id: h, op: exp, args: [x], shape: [a]}", ["node 'h'", "shape must be a list"]),
    ("{id: h, op: exp, args: [x], dtype: 4}", ["node 'h'", "dtype must be a name"]),
    ("{id: h, op: sum, args: [x], attrs: {axes: {a: 1}}}",
     ["node 'h'", "attribute 'axes'", "mapping"]),
    ("{id: h, op: sum, args: [x], attrs: [axes, 1]}", ["node 'h'", "'attrs' must be a mapping"]),
    ("[h, exp, x]", ["nodes entry 1", "must be a mapping"]),
])
def test_malformed_node_fields(node, words):
    err = refused(spec(f"- {node}"), SpecError)
    assert all(w in str(err) for w in words), str(err)


def test_undefined_arg_is_a_missing_input():
    err = refused(spec("- {id: h, op: matmul, args: [x, wieghts]}\n"
                       "- {id: weights, op: random_normal, shape: [512, 4], dtype: float32,"
                       " attrs: {seed: 0}}"), SpecError)
    assert "node 'h'" in str(err) and "missing input 'wieghts'" in str(err)
    assert "did you mean 'weights'" in str(err)
    assert err.node == "h"


@pytest.mark.parametrize("nodes,words", [
    ("- {id: h, op: exp, args: [x]}\n- {id: h, op: neg, args: [x]}",
     ["node 'h'", "duplicate id", "another node"]),
    ("- {id: x, op: exp, args: [x]}", ["node 'x'", "duplicate id", "an input"]),
])
def test_duplicate_ids(nodes, words):
    err = refused(spec(nodes), SpecError)
    assert all(w in str(err) for w in words), str(err)


def test_cycle_names_the_nodes_in_it():
    err = refused(spec("""
        - {id: h, op: relu, args: [c]}
        - {id: a, op: add, args: [x, c]}
        - {id: b, op: exp, args: [a]}
        - {id: c, op: neg, args: [b]}
    """), GraphError)
    message = str(err)
    assert "cycle" in message
    # The walk from output h enters the cycle at c: c uses b, b uses a, a uses c.
    assert "c -> b -> a -> c" in message
    assert err.node == "c"


def test_self_loop_is_a_cycle():
    err = refused(spec("- {id: h, op: exp, args: [h]}"), GraphError)
    assert "cycle: h -> h" in str(err)


def test_cycle_among_nodes_no_output_needs_is_found():
    err = refused(spec("""
        - {id: h, op: exp, args: [x]}
        - {id: p, op: neg, args: [q]}
        - {id: q, op: neg, args: [p]}
    """), GraphError)
    assert "cycle" in str(err) and "p -> q -> p" in str(err)


def test_stated_shape_that_disagrees():
    err = refused(spec("""
        - {id: w, op: random_normal, shape: [512, 1024], dtype: float32, attrs: {seed: 0}}
        - {id: h, op: matmul, args: [x, w], shape: [200, 1000]}
    """), GraphError)
    assert "node 'h'" in str(err)
    assert "gives shape (200, 1024)" in str(err) and "states (200, 1000)" in str(err)


def test_operands_that_do_not_fit():
    err = refused(spec("""
        - {id: w, op: random_normal, shape: [500, 1024], dtype: float32, attrs: {seed: 0}}
        - {id: h, op: matmul, args: [x, w]}
    """), GraphError)
    assert "node 'h'" in str(err) and "inner dimensions differ" in str(err)
    assert "(200, 512)" in str(err) and "(500, 1024)" in str(err)


def test_stated_dtype_that_disagrees():
    err = refused(spec("- {id: h, op: relu, args: [x], dtype: float64}"), GraphError)
    assert "node 'h'" in str(err)
    assert "gives dtype float32" in str(err) and "states float64" in str(err)


def test_literal_typing_is_checked_against_stated_dtype():
    # 2.5 is a weak scalar: with a float32 operand it is float32, so the sum is float32.
    err = refused(spec("- {id: h, op: add, args: [x, 2.5], dtype: float64}"), GraphError)
    assert "node 'h'" in str(err) and "gives dtype float32" in str(err)


@pytest.mark.parametrize("outputs,cls,words", [
    ("[hh]", SpecError, ["output 'hh' is not defined", "did you mean 'h'"]),
    ("[{y: q}]", SpecError, ["output 'y' names node 'q'", "not defined"]),
    ("[]", SpecError, ["'outputs' is empty"]),
    ("h", SpecError, ["'outputs' must be a list"]),
    ("[{a: h, b: h}]", SpecError, ["one {name: node id} entry"]),
    ("[h, h]", GraphError, ["output name 'h' is used twice"]),
])
def test_bad_outputs(outputs, cls, words):
    err = refused(spec("- {id: h, op: exp, args: [x]}", outputs), cls)
    assert all(w in str(err) for w in words), str(err)


def test_missing_file_names_the_path(tmp_path):
    for source in (tmp_path / "nope.yaml", str(tmp_path / "nope.yaml"), "graphs/nope.yml"):
        with pytest.raises(SpecError) as info:
            from_yaml(source)
        assert str(source) in str(info.value) and "no such graph spec file" in str(info.value)


def test_errors_from_a_file_name_the_file_and_the_node(tmp_path):
    path = tmp_path / "shapes.yaml"
    path.write_text(spec("- {id: h, op: relu, args: [x], shape: [3]}"))
    with pytest.raises(GraphError) as info:
        from_yaml(path)
    assert type(info.value) is GraphError
    assert str(info.value).startswith(f"{path}: node 'h': ")
    assert "states (3,)" in str(info.value)
    assert info.value.node == "h"


def test_errors_from_text_do_not_invent_a_file():
    err = refused(spec("- {id: h, op: nope, args: [x]}"), GraphError)
    assert str(err).startswith("node 'h': unknown operator 'nope'")


def test_not_a_path_or_text():
    with pytest.raises(SpecError) as info:
        from_yaml(42)
    assert "file path or YAML text" in str(info.value) and "int" in str(info.value)


def test_the_example_graphs_are_all_valid():
    # A guard that the fixtures the other tests rely on stay loadable.
    for path in (Path(__file__).resolve().parents[2] / "graphs").glob("*.yaml"):
        assert len(from_yaml(path).outputs) >= 1


def test_an_unknown_attribute_lists_only_what_users_may_write():
    """A reduction's fused prologue and a matmul's epilogue are the compiler's: a typo is
    answered with the attributes a user writes, and the one meant."""
    err = refused(spec("- {id: h, op: sum, args: [x], attrs: {axis: 0}}"), GraphError)
    assert str(err) == ("node 'h': sum has no attribute 'axis' (allowed: axes, keepdims); "
                        "did you mean 'axes'?")
    err = refused(spec("- {id: h, op: matmul, args: [x, x], attrs: {transpose_b: true}}"),
                  GraphError)
    assert "matmul has no attribute 'transpose_b' (allowed: none)" in str(err)
    assert "epilogue" not in str(err)
