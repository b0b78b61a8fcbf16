"""A YAML loader that bounds what a document may expand into.

`yaml.safe_load` builds no Python objects from a spec, but it still builds whatever structure
the text describes, and YAML lets a short text describe a huge or endless one: an alias
(`*a`) repeats the value of its anchor (`&a`), so ten lines of aliases of aliases (the
"billion laughs") stand for 10**10 values, an alias inside its own anchor's value makes a
list that contains itself, and five thousand `[` make a structure too deep for Python's
recursion limit. The reader walks and prints what it loads, so such documents used to run
for minutes, fill gigabytes, or end in a RecursionError.

`load` refuses them while composing, before anything is built, with a SpecError that gives
the line and column:

* nesting deeper than `MAX_DEPTH` levels (a spec needs about ten);
* more than `MAX_NODES` YAML values in all, counting each alias as the values it repeats
  (aliases that only name a shared value, as in `y: *spec`, cost what that value holds);
* an alias used inside the value of its own anchor;
* integers longer than `MAX_INT_CHARS` characters, which no dtype can hold and which Python
  refuses to print.
"""

from __future__ import annotations

from typing import Any

import yaml

from deepx_flow.errors import SpecError

# A graph spec nests about ten levels (document, nodes, node, attrs, program, instruction,
# argument); fused programs written out by hand need no more.
MAX_DEPTH = 64
# Values in the whole document once aliases are expanded: a spec of tens of thousands of
# nodes fits; a billion laughs does not.
MAX_NODES = 1_000_000
# The longest integer literal, in characters: 2**64 needs 20 digits, float64's largest
# value 309; binary and hexadecimal forms of those fit too.
MAX_INT_CHARS = 400


def load(text: str) -> Any:
    """Parse one YAML document within the bounds of the module docstring.

    Parameters
    ----------
    text : str
        The document.

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
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _refused(mark, message: str) -> SpecError:
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return SpecError(where + message)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts depth and expanded values while it composes."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._values = 0                 # values so far, aliases counted as what they repeat
        self._sizes: dict[str, int] = {}  # anchor -> values its node stands for
        self._open: set[str] = set()     # anchors whose value is being composed

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor
            if anchor in self._open:
                raise _refused(event.start_mark, f"the alias *{anchor} is used inside the value "
                               f"of its own anchor &{anchor}, which would make a structure that "
                               "contains itself; repeat the value instead")
            # An undefined alias is the composer's own error, raised below.
            self._grow(self._sizes.get(anchor, 0), event)
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise _refused(event.start_mark, f"the document is nested more than {MAX_DEPTH} "
                           "levels deep; a graph spec needs about ten")
        anchor = event.anchor
        before = self._values
        self._grow(1, event)
        self._depth += 1
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor)
        if anchor is not None:
            self._sizes[anchor] = self._values - before
        return node

    def _grow(self, values: int, event) -> None:
        self._values += values
        if self._values > MAX_NODES:
            raise _refused(event.start_mark, f"the document expands to more than "
                           f"{MAX_NODES:,} values once its aliases (*name) are repeated; a "
                           "graph spec is far smaller: use fewer aliases")

    def construct_yaml_int(self, node):
        digits = node.value.replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_CHARS:
            raise _refused(node.start_mark, f"an integer of {len(digits):,} characters; no "
                           "dtype holds a number this long")
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
