"""The operator table (`operators.yaml` beside this file): every operator a graph may name,
primitive or composite, with its inputs, typed attributes and their defaults, what it
states, its dtype rule, whether gradients flow through it, and the version it appeared in.

It is the one source every SDK's operator functions are generated from (`sdks/generate.py`),
so that no language lacks a function another has. Python's registry (`OPS`) stays the
compiler's truth; a test holds the two equal, attribute by attribute and default by default.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

TABLE = Path(__file__).with_name("operators.yaml")

KINDS = ("primitive", "composite")
ATTR_TYPES = ("bool", "int", "float", "number", "scalar", "string", "ints", "int_pairs",
              "shape", "dtype")
DTYPE_RULES = ("same", "promote", "true_divide", "float", "reduce", "bool", "int64", "stated")
STATES = ("shape", "dtype")


@dataclass(frozen=True)
class Attr:
    """One attribute (or stated field): its type, and its default unless `required`."""

    name: str
    type: str
    required: bool = False
    default: object = None
    doc: str = ""


@dataclass(frozen=True)
class Operator:
    """One entry of the table (see the comments at the top of `operators.yaml`)."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    attrs: tuple[Attr, ...]
    states: tuple[Attr, ...]
    dtype: str
    differentiable: bool
    since: str
    doc: str
    category: str = ""
    python: str = ""

    @property
    def variadic(self) -> bool:
        return any(i.endswith("...") for i in self.inputs)

    def input_names(self) -> tuple[str, ...]:
        """The inputs' bare names (no `...` or `?`)."""
        return tuple(i.rstrip("?").removesuffix("...") for i in self.inputs)

    def optional_inputs(self) -> tuple[str, ...]:
        return tuple(i[:-1] for i in self.inputs if i.endswith("?"))

    def state(self, name: str) -> Attr | None:
        return next((s for s in self.states if s.name == name), None)


def operator_table() -> dict[str, Operator]:
    """The table's operators by name, in the file's order, and after them the composites of
    DEEPX_EXTRA_OPERATORS where it names a file (ValueError for a malformed table: a test
    reads this one, so a mistake is found before any SDK is generated from it)."""
    from deepx_flow.config import settings
    from deepx_flow.errors import SettingsError
    extra = settings().extra_operators
    try:
        return _tables(extra)
    except ValueError as err:
        if extra is None:
            raise  # (this package's own table: a test reads it)
        raise SettingsError(f"DEEPX_EXTRA_OPERATORS: {err}") from None


@functools.cache
def _tables(extra: str | None) -> dict[str, Operator]:
    out = _read(TABLE)
    if extra is None:
        return out
    added = _read(Path(extra))
    for op in added.values():
        problem = ("is already in the table" if op.name in out else
                   "is no composite" if op.kind != "composite" else
                   "is not named package.module:function by its python"
                   if not re.fullmatch(r"[\w.]+:\w+", op.python) else
                   "is not a lower-case identifier, or is a member of the SDKs' Graph"
                   if not NAME.fullmatch(op.name) or op.name in GRAPH_MEMBERS else
                   "has an input named as a keyword of an SDK's language, or no identifier"
                   if any(not NAME.fullmatch(i) or i in KEYWORDS for i in op.input_names())
                   else None)
        if problem:
            raise ValueError(f"{extra}: operator {op.name!r} {problem} (an extra table adds "
                             f"composites that every SDK can name)")
    return {**out, **added}


NAME = re.compile(r"[a-z][a-z0-9_]*")
GRAPH_MEMBERS = {"op", "input", "output", "to_spec", "spec", "err", "graph", "nodes", "inputs",
                 "outputs", "constructor", "prototype"}
KEYWORDS = {"var", "func", "type", "map", "range", "chan", "go", "select", "defer", "package",
            "import", "interface", "struct", "default", "case", "switch", "const", "for",
            "if", "else", "return", "break", "continue", "goto", "fallthrough", "new",
            "delete", "function", "class", "in", "do", "while", "this", "void", "with",
            "yield", "let", "static", "enum", "await", "try", "catch", "finally", "throw",
            "typeof", "instanceof", "export", "extends", "super", "null", "true", "false",
            "end", "local", "then", "elseif", "repeat", "until", "nil", "not", "and", "or",
            "public", "private", "protected", "final", "int", "long", "double", "float",
            "char", "short", "byte", "boolean", "implements", "debugger"}


def _read(path: Path) -> dict[str, Operator]:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: cannot be read as an operator table: {err}") from None
    if not isinstance(document, dict) or document.get("version") != 1 or \
            not isinstance(document.get("operators"), list):
        raise ValueError(f"{path}: not an operator table of version 1")
    out: dict[str, Operator] = {}
    for entry in document["operators"]:
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: an operator is not a mapping")
        op = _operator(entry, path)
        if op.name in out:
            raise ValueError(f"{path}: operator {op.name!r} is listed twice")
        out[op.name] = op
    return out


def _operator(entry: dict, path: Path = TABLE) -> Operator:
    name = entry.get("name")
    where = f"{path}: operator {name!r}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}: an operator has no name (a string)")
    known = {"name", "kind", "category", "python", "inputs", "attrs", "states", "dtype",
             "differentiable", "since", "doc"}
    if set(entry) - known:
        raise ValueError(f"{where}: unknown fields {sorted(set(entry) - known)}")
    if entry.get("kind") not in KINDS:
        raise ValueError(f"{where}: kind must be one of {KINDS}")
    if entry.get("dtype") not in DTYPE_RULES:
        raise ValueError(f"{where}: dtype rule {entry.get('dtype')!r} is not one of "
                         f"{DTYPE_RULES}")
    if (entry["kind"] == "composite") != bool(entry.get("python")):
        raise ValueError(f"{where}: a composite, and only a composite, names its python "
                         f"function")
    inputs = entry.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs):
        raise ValueError(f"{where}: inputs must be a list of names")
    attrs = tuple(_attr(where, n, a, ATTR_TYPES) for n, a in (entry.get("attrs") or {}).items())
    states = tuple(_attr(where, n, a, STATES) for n, a in (entry.get("states") or {}).items())
    if any(s.name not in STATES or s.type != s.name for s in states):
        raise ValueError(f"{where}: states are shape and dtype, each of its own type")
    if not isinstance(entry.get("differentiable"), bool) or \
            not isinstance(entry.get("since"), str) or not isinstance(entry.get("doc"), str):
        raise ValueError(f"{where}: differentiable (a bool), since and doc (strings) are "
                         f"required")
    return Operator(name, entry["kind"], tuple(inputs), attrs, states, entry["dtype"],
                    entry["differentiable"], entry["since"], entry["doc"],
                    entry.get("category", ""), entry.get("python", ""))


def _attr(where: str, name: str, fields: dict, types: tuple) -> Attr:
    if not isinstance(fields, dict) or fields.get("type") not in types or \
            set(fields) - {"type", "required", "default", "doc"} or \
            ("required" in fields) == ("default" in fields):
        raise ValueError(f"{where}: attribute {name!r} needs a type of {types} and either "
                         f"required: true or a default")
    return Attr(name, fields["type"], bool(fields.get("required", False)),
                fields.get("default"), fields.get("doc", ""))


__all__ = ["Attr", "Operator", "operator_table", "TABLE"]
