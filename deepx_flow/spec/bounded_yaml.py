"""A YAML loader that bounds what a document may expand into.

`yaml.safe_load` builds no Python objects from a spec, but it still builds whatever structure
the text describes, and YAML lets a short text describe a huge or endless one: an alias
(`*a`) repeats the value of its anchor (`&a`), so ten lines of aliases of aliases (the
"billion laughs") stand for 10**10 values, an alias inside its own anchor's value makes a
list that contains itself, and five thousand `[` make a structure too deep for Python's
recursion limit. The reader walks and prints what it loads, so such documents used to run
for minutes, fill gigabytes, or end in a RecursionError.

`load` composes the document (YAML's node graph, in which an alias is its anchor's node
again, not a copy, so composing costs what the text holds) and builds Python values from it,
checking as it goes; an alias is built as its anchor's value again, never copied, so building
also costs what the text holds. It refuses, with a SpecError that gives the line and
column:

* more than `max_nodes` entries under the document's `inputs` and `nodes` (the graph's size,
  `DEEPX_MAX_NODES`);
* nesting deeper than `MAX_DEPTH` levels (a spec needs about ten);
* more than `VALUES_PER_NODE` values a node in all, counting each alias as the values it
  repeats (aliases that only name a shared value, as in `y: *spec`, cost what that value
  holds);
* an alias used inside the value of its own anchor;
* integers longer than `MAX_INT_CHARS` characters, which no dtype can hold and which Python
  refuses to print.

Composing is libyaml's (PyYAML's C parser, `yaml.CSafeLoader`'s) where PyYAML was built with
it; libyaml refuses nesting past 1,000 levels itself. Without it PyYAML's Python parser
composes, and a document nested past Python's recursion limit is refused as too deep. The
cyclic garbage collector is paused while a document is loaded: every value is a new object
that lives on, so each collection it would run finds nothing to free but walks all of them
again (a 20,000-node spec loads in 60% of the time without them); nothing a
spec builds is cyclic, as an alias inside its own value is refused.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from deepx_flow.errors import SpecError

# A graph spec nests about ten levels (document, nodes, node, attrs, program, instruction,
# argument); fused programs written out by hand need no more.
MAX_DEPTH = 64
# Values a node may take, on average over the document once aliases are expanded: a node
# written out takes about fifteen (its mapping, keys, arguments, shape, dtype), one with a
# few attributes thirty; a billion laughs takes billions.
VALUES_PER_NODE = 32
# The longest integer literal, in characters: 2**64 needs 20 digits, float64's largest
# value 309; binary and hexadecimal forms of those fit too.
MAX_INT_CHARS = 400
# The top-level keys whose entries are the graph's inputs and nodes.
GRAPH_SECTIONS = ("inputs", "nodes")


def load(text: str, max_nodes: int) -> Any:
    """Parse one YAML document within the bounds of the module docstring.

    Parameters
    ----------
    text : str
        The document.
    max_nodes : int
        The most entries its `inputs` and `nodes` may hold (`Settings.max_nodes`); the
        document may hold `VALUES_PER_NODE` values for each.

    Returns
    -------
    any
        What `yaml.safe_load` gives for it.

    Raises
    ------
    SpecError
        The document is past a bound ("line L, column C: ..." names where).
    yaml.YAMLError
        The text is not YAML.
    """
    loader = _Loader(text)
    try:
        with collector_paused():
            try:
                root = loader.get_single_node()
            except RecursionError:  # PyYAML's Python composer recurses once a level
                raise _too_deep(None) from None
            except yaml.MarkedYAMLError as err:
                # libyaml's own bound on nesting (1,000 levels): the same refusal.
                if err.problem and "maximum nesting depth" in err.problem:
                    raise _too_deep(err.problem_mark) from None
                raise
            if root is None:
                return None
            _check_entries(root, max_nodes)
            return _Builder(loader, max_nodes).value(root, 1)
    finally:
        loader.dispose()


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off for the block, as it was after it: for blocks that
    build many objects that all live on (a document's values, the graph made of them)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _check_entries(root: Node, max_nodes: int) -> None:
    """At most `max_nodes` inputs and nodes (an input is a mapping entry, a node a list
    item), before anything is built from them."""
    if not isinstance(root, MappingNode):
        return
    entries = [entry for key, value in root.value
               if isinstance(key, ScalarNode) and key.value in GRAPH_SECTIONS
               and isinstance(value, (MappingNode, SequenceNode))
               for entry in value.value]
    if len(entries) > max_nodes:
        first_past = entries[max_nodes]
        mark = (first_past[0] if isinstance(first_past, tuple) else first_past).start_mark
        raise _refused(mark, f"the spec has {len(entries):,} inputs and nodes, more than the "
                       f"{max_nodes:,} a graph may have (DEEPX_MAX_NODES={max_nodes}: raise "
                       "it to read larger graphs)")


def _check_values(top: Node, depth: int, max_nodes: int) -> int:
    """The values `top` (at `depth`) stands for, aliases expanded, after checking its depth,
    self-containing aliases and size, by one walk of its node graph that visits each
    collection once (one reached again through an alias counts the values it holds, known
    from the first visit; a scalar is one value). For what `_Builder` leaves to the loader."""
    max_values = VALUES_PER_NODE * max_nodes
    sizes: dict[int, int] = {}  # id(collection) -> values it stands for, aliases expanded
    on_path: set[int] = set()   # the collections being walked into (the current one's
    aliased = False             # ancestors)
    stack: list[tuple[Node, int, bool]] = [(top, depth, False)]  # node, depth, leaving it
    while stack:
        node, depth, leaving = stack.pop()
        key = id(node)
        if leaving:
            on_path.discard(key)
            size = 1 + sum(sizes.get(id(child), 1) for child in _children(node))
            sizes[key] = size
            if size > max_values:
                raise _too_many_values(node.start_mark, max_values, max_nodes, aliased)
            continue
        if key in sizes:  # reached again: an alias
            aliased = True
            continue
        if key in on_path:
            raise _contains_itself(node.start_mark)
        children = _children(node)
        if children and depth >= MAX_DEPTH:  # its children would be past the bound
            raise _too_deep(children[0].start_mark)
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children
                     if child.__class__ is not ScalarNode)
    return sizes.get(id(top), 1)


_STR, _SEQ, _MAP, _MERGE = (f"tag:yaml.org,2002:{name}" for name in ("str", "seq", "map", "merge"))
# The tags whose safe constructor takes a scalar and returns its value.
_SCALAR_TAGS = frozenset(f"tag:yaml.org,2002:{name}"
                         for name in ("null", "bool", "int", "float", "binary", "timestamp"))


class _Builder:
    """The Python values of a composed document, as `yaml.safe_load` gives them, checked
    while they are built: depth, self-containing aliases and the values the document expands
    into (counting each alias as the values it repeats). An alias is its anchor's value
    again, not a copy, so building costs what the text holds.

    Plain lists, mappings and strings are built here, other scalars by the loader's
    constructor for their tag; anything else (merge keys `<<`, sets, unknown tags, a key that
    cannot be a dictionary key) is checked by `_check_values` and built by the loader, which
    raises its own error where it must. PyYAML's `construct_document` does the same work at a
    third of the speed: its bookkeeping for recursive structures (refused here) costs more
    than the values."""

    def __init__(self, loader: "_Loader", max_nodes: int):
        self.loader, self.max_nodes = loader, max_nodes
        self.max_values = VALUES_PER_NODE * max_nodes
        self.constructors = loader.yaml_constructors
        self.built: dict[int, Any] = {}  # id(collection node) -> its value
        self.sizes: dict[int, int] = {}  # id(collection node) -> values it stands for;
        self.count = 0                   # absent while it is being built
        self.aliased = False

    def value(self, node: Node, depth: int) -> Any:
        if node.__class__ is ScalarNode:
            self.count += 1
            if node.tag == _STR:
                return node.value
            if node.tag in _SCALAR_TAGS:
                return self.constructors[node.tag](self.loader, node)
            # Built whole (deep) now, or refused now: PyYAML finishes some values later.
            return self.loader.construct_object(node, deep=True)
        key = id(node)
        if key in self.built:  # an alias
            if key not in self.sizes:
                raise _contains_itself(node.start_mark)
            self.aliased = True
            self.count += self.sizes[key]
            return self.built[key]
        if node.value and depth >= MAX_DEPTH:  # its children would be past the bound
            first = node.value[0]
            raise _too_deep((first[0] if isinstance(first, tuple) else first).start_mark)
        start = self.count
        self.count += 1
        if node.__class__ is SequenceNode and node.tag == _SEQ:
            items = self.built[key] = []
            items.extend(self.value(item, depth + 1) for item in node.value)
            made: Any = items
        elif node.__class__ is MappingNode and node.tag == _MAP \
                and all(k.tag != _MERGE for k, _ in node.value):
            made = self.built[key] = {}
            for k, v in node.value:
                name = self.value(k, depth + 1)
                if name.__hash__ is None:  # the loader says why it cannot be a key
                    return self.loader.construct_object(node, deep=True)
                made[name] = self.value(v, depth + 1)
        else:
            self.count += _check_values(node, depth, self.max_nodes) - 1
            made = self.built[key] = self.loader.construct_object(node, deep=True)
        self.sizes[key] = self.count - start
        if self.sizes[key] > self.max_values:
            raise _too_many_values(node.start_mark, self.max_values, self.max_nodes,
                                   self.aliased)
        return made


def _children(node: Node) -> list[Node]:
    if node.__class__ is SequenceNode:
        return node.value
    if node.__class__ is MappingNode:
        return [part for pair in node.value for part in pair]
    return []


def _refused(mark, message: str) -> SpecError:
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return SpecError(where + message)


def _contains_itself(mark) -> SpecError:
    return _refused(mark, "an alias (*name) is used inside the value of its own anchor (&name) "
                    "here, which would make a structure that contains itself; repeat the "
                    "value instead")


def _too_deep(mark) -> SpecError:
    return _refused(mark, f"the document is nested more than {MAX_DEPTH} levels deep; a "
                    "graph spec needs about ten")


def _too_many_values(mark, max_values: int, max_nodes: int, aliased: bool) -> SpecError:
    if aliased:
        return _refused(mark, f"the document expands to more than {max_values:,} values once "
                        "its aliases (*name) are repeated; a graph spec is far smaller: use "
                        "fewer aliases")
    return _refused(mark, f"the document holds more than {max_values:,} values, more than "
                    f"{VALUES_PER_NODE} for each of the {max_nodes:,} nodes a graph may have "
                    f"(DEEPX_MAX_NODES={max_nodes}: raise it to read larger graphs)")


# libyaml's parser and composer where PyYAML has them (`yaml.CSafeLoader`), else PyYAML's.
_SafeLoader = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _Loader(_SafeLoader):
    """The safe loader, refusing integers too long to be a number of any dtype, and
    remembering the type it resolved for each plain scalar: a spec repeats its dtypes,
    operators and sizes thousands of times, and the resolver tries its patterns on each."""

    def __init__(self, text: str):
        super().__init__(text)
        self._plain_tags: dict[str, str] = {}

    def resolve(self, kind, value, implicit):
        if kind is ScalarNode and implicit[0]:  # a plain scalar: its tag follows its text
            tag = self._plain_tags.get(value)
            if tag is None:
                tag = self._plain_tags[value] = super().resolve(kind, value, implicit)
            return tag
        return super().resolve(kind, value, implicit)

    def construct_yaml_int(self, node):
        digits = self.construct_scalar(node).replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_CHARS:
            raise _refused(node.start_mark, f"an integer of {len(digits):,} characters; no "
                           "dtype holds a number this long")
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
