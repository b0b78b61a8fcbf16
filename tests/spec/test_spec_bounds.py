"""The YAML reader bounds what it expands: nesting, aliases, integers, and the length of what
its messages show. Each case is refused with one SpecError that says where and what to do,
fast and in little memory, instead of a RecursionError, minutes of work or a huge message."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from deepx_flow.errors import GraphError, SpecError
from deepx_flow.config import Settings
from deepx_flow.spec.bounded_yaml import MAX_DEPTH, VALUES_PER_NODE
from deepx_flow.spec.yaml_io import from_yaml

HEADER = "deepx: 1\ninputs:\n  x: {shape: [4, 3], dtype: float32}\n"


def refused_quickly(text: str, seconds: float = 5.0, megabytes: float = 64.0) -> SpecError:
    """The SpecError `from_yaml(text)` raises, checked to come within the time and memory."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(GraphError) as info:
            from_yaml(text)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert type(info.value) is SpecError, f"{type(info.value).__name__}: {info.value}"
    assert elapsed < seconds, f"took {elapsed:.1f} s"
    assert peak < megabytes * 2**20, f"peak {peak / 2**20:.0f} MiB"
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message[:1000]
    return info.value


@pytest.mark.parametrize("where", ["nodes: {}\noutputs: [x]\n",
                                   "nodes:\n - {{id: h, op: sum, args: [x], attrs: {{axes: {}}}}}"
                                   "\noutputs: [h]\n",
                                   "outputs: {}\n"])
def test_deep_nesting_is_refused_with_its_line(where):
    deep = "[" * 5000 + "]" * 5000
    err = refused_quickly(HEADER + where.format(deep))
    assert f"nested more than {MAX_DEPTH} levels deep" in str(err)
    assert "line " in str(err)


def test_nesting_within_the_bound_is_read():
    # A list nested just under the bound is YAML the reader reads; the attribute is then
    # refused by the operator's own rule, not by the bound.
    depth = MAX_DEPTH - 6  # the document, the nodes list, the node, attrs, the list itself
    nested = "[" * depth + "1" + "]" * depth
    with pytest.raises(GraphError) as info:
        from_yaml(HEADER + f"nodes:\n - {{id: h, op: sum, args: [x], attrs: {{axes: {nested}}}}}"
                           "\noutputs: [h]\n")
    assert "nested more than" not in str(info.value)
    assert "node 'h'" in str(info.value)


@pytest.mark.parametrize("text", [
    HEADER + "nodes: &a [*a]\noutputs: [x]\n",
    HEADER + "outputs: &a [x, *a]\n",
    HEADER + "nodes:\n - &n {id: h, op: exp, args: [x], attrs: {foo: *n}}\noutputs: [h]\n",
    "deepx: 1\nnodes:\n - {id: h, op: full, shape: [], dtype: float32, attrs: {value: &a [*a]}}"
    "\noutputs: [h]\n",
])
def test_self_referencing_alias_is_refused(text):
    err = refused_quickly(text)
    assert "contains itself" in str(err) and "*" in str(err) and "line " in str(err)


def _laughs(levels: int, width: int = 10) -> str:
    """The 'billion laughs': each anchor is a list of `width` aliases of the one before."""
    lines = ["a0: &a0 [lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines)


@pytest.mark.parametrize("use", ["", "args", "attrs"])
def test_alias_bomb_is_refused_fast_and_small(use):
    # The bomb sits under `description`; a node may also use its last anchor.
    bomb = _laughs(12).replace("\n", "\n  ")  # *a11 is 10**11 leaves once expanded
    node = {"": "{id: h, op: exp, args: [x]}",
            "args": "{id: h, op: exp, args: [x, *a11]}",
            "attrs": "{id: h, op: exp, args: [x], attrs: {foo: *a11}}"}[use]
    text = (f"deepx: 1\ndescription:\n  {bomb}\n"
            f"inputs:\n  x: {{shape: [4, 3], dtype: float32}}\nnodes:\n - {node}\n"
            "outputs: [h]\n")
    err = refused_quickly(text)
    assert "aliases" in str(err) and f"{VALUES_PER_NODE * Settings().max_nodes:,}" in str(err)


def test_merge_key_bomb_is_refused():
    lines = ["m0: &m0 {k: v}"]
    for i in range(1, 30):
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}], x{i}: [*m{i - 1}, *m{i - 1}]}}")
    text = "deepx: 1\nname:\n  " + "\n  ".join(lines) + "\noutputs: [x]\n"
    err = refused_quickly(text)
    assert "aliases" in str(err)


def test_a_few_aliases_within_the_bound_are_read():
    text = ("deepx: 1\ninputs:\n  x: &spec {shape: [4, 3], dtype: float32}\n  y: *spec\n"
            "nodes:\n - {id: h, op: add, args: [x, y]}\noutputs: [h]\n")
    graph = from_yaml(text)
    assert graph["y"].shape == (4, 3) and graph["h"].shape == (4, 3)


def test_huge_integer_is_refused_not_crashed():
    digits = "9" * 5000  # past Python's limit for converting digits to int
    err = refused_quickly(f"deepx: 1\ninputs:\n  x: {{shape: [{digits}], dtype: float32}}\n"
                          "outputs: [x]\n")
    assert "integer" in str(err) and "line 3" in str(err)


@pytest.mark.parametrize("bad", [
    # A big mapping where a list of args belongs: the message shows the start of it only.
    "args: {" + ", ".join(f"k{i}: {i}" for i in range(20000)) + "}",
    # A long string where an operator name belongs.
    "args: [x, " + "y" * 100_000 + "]",
])
def test_messages_show_values_shortened(bad):
    text = HEADER + f"nodes:\n - {{id: h, op: exp, {bad}}}\noutputs: [h]\n"
    with pytest.raises(GraphError) as info:
        from_yaml(text)
    message = str(info.value)
    assert "node 'h'" in message and len(message) < 400, message[:1000]
    assert "..." in message


def test_a_long_node_id_is_shortened_in_messages():
    long_id = "n" * 100_000
    err = refused_quickly(HEADER + f"nodes:\n - {{id: {long_id}, op: exp, args: [nope]}}\n"
                                   f"outputs: [{long_id}]\n")
    assert "missing input 'nope'" in str(err) and "nnn...nnn" in str(err)
