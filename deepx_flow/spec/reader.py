"""Turn a parsed YAML graph spec (plain dicts and lists) into a typed, validated `Graph`.

The reader trusts nothing: every field is checked for its type, and every error names the
node (or input, or output) it is about and says what was expected. `yaml_io.from_yaml` adds
the file name in front.

Node order. A spec may list its nodes in any order. The graph's order is canonical: a
depth-first walk from the outputs, in output order, visiting each node's operands in argument
order and emitting a node after its operands. This is exactly the order `build_graph` gives a
graph built in Python, so a graph written by `to_yaml` reads back equal (`==`), and two specs
that list the same nodes differently read as equal graphs. Nodes that no output needs (inputs
first, then nodes, in file order) come after, in the same way; they are kept because removing
them is the compiler's business, not the reader's.

Scalar literals in `args` become 0-d `full` nodes typed like the other operand (see
`normalize.literal_dtype`). They sit in the walk where the literal was written, but their
dtype depends on operands that may come later (`args: [1.0, h]`), so the reader first fixes
the order, then types the nodes in it, making each node's literals just before the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from deepx_flow.compiler.infer import infer_node
from deepx_flow.compiler.validate import validate_graph
from deepx_flow.errors import GraphError, SpecError, did_you_mean, shown
from deepx_flow.ir import Graph, Node, dtypes
from deepx_flow.ir.node import make_attrs
from deepx_flow.ops import OPS
from deepx_flow.spec.composites import check_attrs, composites, expand
from deepx_flow.spec.normalize import is_literal, literal_dtype, literal_node, normalize_attrs
from deepx_flow.spec.writer import VERSION

TOP_KEYS = ("deepx", "name", "description", "inputs", "nodes", "outputs")
INPUT_KEYS = ("shape", "dtype")
NODE_KEYS = ("id", "op", "args", "shape", "dtype", "attrs")

# Floats in exponent form without a dot or without an exponent sign (`1e-05`, `1.5e3`) are
# floats in YAML 1.2, which JSON and most other languages' YAML libraries write, but strings
# in YAML 1.1, which PyYAML reads. Where a spec expects a number, such strings are numbers.
_EXPONENT_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")


@dataclass(frozen=True)
class Literal:
    """A number or bool written in `args` in place of a node id."""

    value: bool | int | float


@dataclass
class Entry:
    """One input or node of a spec, with its fields checked for type but not yet typed."""

    id: str
    op: str
    args: tuple  # of node ids (str) and Literal
    shape: tuple[int, ...] | None
    dtype: str | None
    attrs: dict[str, Any]
    composite: Any = None  # the table's Operator, for a composite (expanded when typed)


def document_to_graph(doc: Any) -> Graph:
    """The graph a parsed spec describes, typed and validated.

    Parameters
    ----------
    doc : any
        What `yaml.safe_load` gave for the spec text.

    Returns
    -------
    Graph
        Nodes in canonical order (see the module docstring), every shape and dtype set,
        outputs named and ordered as the spec's `outputs` list.

    Raises
    ------
    SpecError
        The document does not follow the format: version, keys, field types, undefined or
        duplicate ids, unknown outputs.
    GraphError
        The graph it describes is wrong: unknown operator or attribute, cycle, operands whose
        shapes or dtypes do not fit, a stated shape or dtype that disagrees with the inferred one.
    """
    _check_top(doc)
    entries = _parse_entries(doc, composites())  # (the table read once a document)
    outputs = _parse_outputs(doc["outputs"], entries)
    order = _walk(entries, [node_id for _, node_id in outputs])
    # Each node was typed as it was made (`_type_node`), its operands before it.
    return validate_graph(Graph(_type_nodes(entries, order), tuple(outputs)))


# -- the document's structure --------------------------------------------------------------
def _check_top(doc: Any) -> None:
    if doc is None:
        raise SpecError(f"the spec is empty; it needs at least `deepx: {VERSION}` and outputs")
    if not isinstance(doc, dict):
        raise SpecError(f"a spec must be a YAML mapping (deepx, inputs, nodes, outputs), not a "
                        f"{_kind(doc)}")
    for key in doc:
        if key not in TOP_KEYS:
            raise SpecError(f"unknown top-level key {shown(key)}{did_you_mean(key, TOP_KEYS)}; "
                            f"allowed: {', '.join(TOP_KEYS)}")
    if "deepx" not in doc:
        raise SpecError(f"missing the version key: start the spec with `deepx: {VERSION}`")
    version = doc["deepx"]
    if type(version) is not int or version != VERSION:
        raise SpecError(f"unsupported spec version {shown(version)}: this deepx_flow reads "
                        f"`deepx: {VERSION}`")
    for key in ("name", "description"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise SpecError(f"{shown(key)} must be a string, not a {_kind(doc[key])}")
    if "outputs" not in doc:
        raise SpecError("missing 'outputs': list the ids of the nodes the graph computes")


def _parse_entries(doc: dict, composites: dict) -> dict[str, Entry]:
    """Inputs then nodes, by id, in file order; checks types and that ids are unique."""
    entries: dict[str, Entry] = {}
    inputs = doc.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise SpecError(f"'inputs' must be a mapping of input name to {{shape, dtype}}, not a "
                        f"{_kind(inputs)}")
    for name, fields in inputs.items():
        entry = _parse_input(name, fields)
        entries[entry.id] = entry
    nodes = doc.get("nodes") or []
    if not isinstance(nodes, list):
        raise SpecError(f"'nodes' must be a list of node mappings, not a {_kind(nodes)}")
    for position, fields in enumerate(nodes):
        entry = _parse_node(position, fields, composites)
        if entry.id in entries:
            what = "an input" if entries[entry.id].op == "input" else "another node"
            raise SpecError(f"duplicate id: {what} already has the id {shown(entry.id)}; ids "
                            "must be unique", entry.id)
        entries[entry.id] = entry
    return entries


def _parse_input(name: Any, fields: Any) -> Entry:
    if not isinstance(name, str) or not name:
        raise SpecError(f"input names must be non-empty strings, got {shown(name)} (quote it)")
    if not isinstance(fields, dict):
        raise _input_error(name, f"must be a mapping {{shape: [...], dtype: ...}}, not a "
                                 f"{_kind(fields)}")
    for key in fields:
        if key not in INPUT_KEYS:
            raise _input_error(name, f"unknown key {shown(key)}; an input has only shape and dtype")
    for key in INPUT_KEYS:
        if fields.get(key) is None:
            raise _input_error(name, f"needs a {key} (an input has no operands to take it "
                                     "from)")
    return Entry(name, "input", (), _parse_shape(fields["shape"], name),
                 _parse_dtype(fields["dtype"], name), {})


def _input_error(name: str, message: str) -> SpecError:
    """Errors about inputs say "input 'x'", which is what the spec's author wrote."""
    err = SpecError(f"input {shown(name)}: {message}")
    err.node = name
    return err


def _parse_node(position: int, fields: Any, composites: dict) -> Entry:
    if not isinstance(fields, dict):
        raise SpecError(f"nodes entry {position + 1} must be a mapping {{id, op, args, ...}}, "
                        f"not a {_kind(fields)}")
    node_id = fields.get("id")
    if not isinstance(node_id, str) or not node_id:
        got = ("has no 'id'" if node_id is None else
               f"has id {shown(node_id)}, which is not a string")
        raise SpecError(f"nodes entry {position + 1} {got}; give every node a string id "
                        "(quote ids such as 'on', 'yes' or '1' that YAML reads as other types)")
    op = fields.get("op")
    if not isinstance(op, str):
        raise SpecError("missing 'op' (the operator name)" if op is None else
                        f"'op' must be an operator name, not {shown(op)}", node_id)
    expanded = composites.get(op)
    if op not in OPS and expanded is None:
        names = list(OPS) + list(composites)
        raise GraphError(f"unknown operator {shown(op)}{did_you_mean(op, names)} (see "
                         "docs/graph-spec.md or `deepx-flow ops` for the list)", node_id)
    attr_names = OPS[op].attrs if expanded is None else [a.name for a in expanded.attrs]
    for key in fields:
        if key not in NODE_KEYS:
            hint = (f"; {shown(key)} is an attribute of {op}: put it under attrs"
                    if key in attr_names else did_you_mean(key, NODE_KEYS))
            raise SpecError(f"unknown key {shown(key)}{hint}; a node has {', '.join(NODE_KEYS)}",
                            node_id)
    args = fields.get("args") or []
    if not isinstance(args, list):
        raise SpecError(f"'args' must be a list of node ids and numbers, not {shown(args)}",
                        node_id)
    parsed_args = []
    for arg in map(_yaml12_number, args):
        if is_literal(arg):
            parsed_args.append(Literal(arg))
        elif isinstance(arg, str) and arg:
            parsed_args.append(arg)
        else:
            raise SpecError(f"each arg must be a node id or a number, got {shown(arg)}", node_id)
    shape = None if fields.get("shape") is None else _parse_shape(fields["shape"], node_id)
    dtype = None if fields.get("dtype") is None else _parse_dtype(fields["dtype"], node_id)
    attrs = fields.get("attrs") or {}
    if not isinstance(attrs, dict):
        raise SpecError(f"'attrs' must be a mapping of attribute name to value, not {shown(attrs)}",
                        node_id)
    for key, value in attrs.items():
        if not isinstance(key, str):
            raise SpecError(f"attribute names must be strings, got {shown(key)}", node_id)
        _check_attr_value(key, value, node_id)
    attrs = {key: _yaml12_number(value) for key, value in attrs.items()}
    return Entry(node_id, op, tuple(parsed_args), shape, dtype, attrs, expanded)


def _parse_shape(shape: Any, node_id: str) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(type(s) is int for s in shape):
        raise SpecError(f"shape must be a list of integers, got {shown(shape)}", node_id)
    return tuple(shape)


def _parse_dtype(dtype: Any, node_id: str) -> str:
    if not isinstance(dtype, str):
        raise SpecError(f"dtype must be a name such as float32, got {shown(dtype)}", node_id)
    return dtypes.normalize(dtype, node_id)


def _check_attr_value(key: str, value: Any, node_id: str, depth: int = 0) -> None:
    """Attribute values are what the IR can hold: null, bool, numbers, strings, lists of them."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    # YAML anchors can make a list that contains itself; no real attribute nests this deep.
    if isinstance(value, list) and depth < 32:
        for item in value:
            _check_attr_value(key, item, node_id, depth + 1)
        return
    if isinstance(value, list):
        raise SpecError(f"attribute {shown(key)} nests lists too deeply", node_id)
    raise SpecError(f"attribute {shown(key)} has a {_kind(value)} value {shown(value)}; "
                    "attribute values are numbers, strings, booleans, null or lists of them",
                    node_id)


def _yaml12_number(value: Any) -> Any:
    """`value` with YAML 1.2 exponent floats that PyYAML left as strings made floats."""
    if isinstance(value, list):
        return [_yaml12_number(v) for v in value]
    if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value):
        return float(value)
    return value


def _parse_outputs(outputs: Any, entries: dict[str, Entry]) -> list[tuple[str, str]]:
    """`[id, {name: id}, ...]` or `{name: id, ...}` as (name, id) pairs, in the spec's order."""
    if isinstance(outputs, dict):
        items = [{name: node_id} for name, node_id in outputs.items()]
    elif isinstance(outputs, list):
        items = outputs
    else:
        raise SpecError(f"'outputs' must be a list of node ids or {{name: node id}} entries, "
                        f"not {shown(outputs)}")
    if not items:
        raise SpecError("'outputs' is empty: name at least one node the graph computes")
    pairs = []
    for item in items:
        if isinstance(item, str):
            name, node_id = item, item
        elif isinstance(item, dict) and len(item) == 1:
            (name, node_id), = item.items()
        else:
            raise SpecError(f"each output must be a node id or one {{name: node id}} entry, "
                            f"got {shown(item)}")
        if not isinstance(name, str) or not isinstance(node_id, str) or not name:
            raise SpecError(f"output names and node ids must be strings, got {shown(item)}")
        if node_id not in entries:
            named = (f"{shown(name)} names node {shown(node_id)}, which" if name != node_id
                     else shown(name))
            raise SpecError(f"output {named} is not defined as an input or a node"
                            f"{did_you_mean(node_id, entries)}")
        pairs.append((name, node_id))
    return pairs


# -- order ---------------------------------------------------------------------------------
def _walk(entries: dict[str, Entry], roots: list[str]) -> list[tuple]:
    """Canonical order: ("node", id) items and ("literal", user id, arg position) slots.

    Depth-first from each root, operands in argument order, a node after its operands; the
    walk is iterative so that long chains do not reach Python's recursion limit. Raises on an
    undefined operand or a cycle.
    """
    state: dict[str, int] = {}  # 1: on the current path, 2: emitted
    order: list[tuple] = []
    for root in list(roots) + list(entries):
        if root in state:
            continue
        state[root] = 1
        stack = [[root, 0]]  # node id, index of the next operand to visit
        while stack:
            frame = stack[-1]
            node_id, i = frame
            args = entries[node_id].args
            if i == len(args):
                stack.pop()
                state[node_id] = 2
                order.append(("node", node_id))
                continue
            frame[1] += 1
            arg = args[i]
            if isinstance(arg, Literal):
                order.append(("literal", node_id, i))
            elif arg not in entries:
                raise SpecError(f"missing input {shown(arg)}: no input or node has this id"
                                f"{did_you_mean(arg, entries)}", node_id)
            elif state.get(arg) == 1:
                path = [f[0] for f in stack]
                cycle = path[path.index(arg):] + [arg]
                raise GraphError(f"the nodes form a cycle: {_cycle_path(cycle)} (each uses "
                                 "the next as an operand); a graph must be acyclic", arg)
            elif arg not in state:
                state[arg] = 1
                stack.append([arg, 0])
    return order


# -- types ---------------------------------------------------------------------------------
def _type_nodes(entries: dict[str, Entry], order: list[tuple]) -> tuple[Node, ...]:
    """Make and type every node in `order`; literal nodes are made just before their user."""
    done: dict[str, Node] = {}
    literals: dict[tuple[str, int], Node] = {}
    made: dict[tuple, Node] = {}  # (type, repr, dtype) -> its node: one per constant
    steps: dict[str, list[Node]] = {}  # a composite's id -> the nodes before its last
    for item in order:
        if item[0] == "node":
            *steps[item[1]], done[item[1]] = _type_node(entries[item[1]], done, literals,
                                                        made)
    nodes: dict[str, Node] = {}
    for item in order:
        if item[0] == "node":
            placed = steps[item[1]] + [done[item[1]]]
        else:
            placed = [literals[(item[1], item[2])]]
        for node in placed:
            if node.id in nodes:
                # The same constant written twice is one node, as in the SDK (and so is the
                # same step of two composites); anything else sharing an id (a node copied
                # with another value) is an error.
                if nodes[node.id] != node:
                    raise SpecError("duplicate id: two different nodes have this id", node.id)
                continue
            nodes[node.id] = node
    return tuple(nodes.values())


def _type_node(entry: Entry, done: dict[str, Node], literals: dict[tuple[str, int], Node],
               made: dict[tuple, Node]) -> list[Node]:
    """The typed node of `entry`, after the nodes it expands to where it is a composite."""
    arg_dtypes = [None if isinstance(a, Literal) else done[a].dtype for a in entry.args]
    operands: list[Node] = []
    for position, arg in enumerate(entry.args):
        if isinstance(arg, Literal):
            dtype = literal_dtype(arg.value, position, entry.op, arg_dtypes)
            # The same constant is the same node (its id is a content hash), made once: a
            # chain of 20,000 `+ 0.5` spent a third of its typing remaking it. Its repr
            # tells 0.0 from -0.0 and 1 from 1.0 and True, which compare equal.
            key = (type(arg.value), repr(arg.value), dtype)
            literal = made.get(key)
            if literal is None:
                literal = made[key] = infer_node(literal_node(arg.value, dtype), [])
            literals[(entry.id, position)] = literal
            operands.append(literal)
        else:
            operands.append(done[arg])
    if entry.composite is not None:
        check_attrs(entry.composite, entry.attrs, entry.id)
        return expand(entry.composite, entry.id, operands, entry.attrs, entry.shape,
                      entry.dtype)
    attrs = normalize_attrs(entry.op, entry.attrs, operands, entry.id)
    node = Node(entry.id, entry.op, tuple(t.id for t in operands), entry.shape, entry.dtype,
                make_attrs(**attrs))
    OPS[entry.op].check_arity(node)
    return [infer_node(node, operands)]


# -- message helpers -----------------------------------------------------------------------
def _cycle_path(cycle: list[str]) -> str:
    """`a -> b -> a`; a long cycle shows its first and last steps, ids shortened."""
    ids = [shown(i)[1:-1] for i in cycle]
    if len(ids) > 8:
        ids = ids[:4] + [f"... ({len(ids) - 7} more)"] + ids[-3:]
    return " -> ".join(ids)




def _kind(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string"}.get(type(value), type(value).__name__)
