"""The one node type of the IR.

A node is plain data: an operator name, the ids of its inputs, its attributes, and the shape
and dtype worked out when it was built. There are no callables inside, so every graph can be
written as YAML and read back unchanged. Attributes are a sorted tuple of `(name, value)`
pairs whose values are None, bool, int, float, str or tuples of those, which keeps nodes
hashable and comparable.

Node ids made by the SDK are content hashes (`add-3f2a9c81b0de`): the same computation built
twice gets the same id, and Dask keys derived from ids are the same in every process.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

Attrs = tuple[tuple[str, Any], ...]


def freeze_attr(value: Any) -> Any:
    """Turn lists into tuples (recursively) so an attribute value is hashable."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if getattr(value, "ndim", 0) and hasattr(value, "tolist"):
        return freeze_attr(value.tolist())  # a NumPy array, as the list it holds
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()  # NumPy scalars become Python scalars
    return value


def make_attrs(**attrs: Any) -> Attrs:
    """Sorted, frozen attributes; None values are dropped so defaults do not change ids."""
    return tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items() if v is not None))


def make_id(op: str, inputs: tuple[str, ...], shape: tuple[int, ...], dtype: str,
            attrs: Attrs) -> str:
    """A content-hash id: equal computations get equal ids, in every process."""
    text = repr((op, inputs, shape, dtype, attrs))
    return f"{op}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


@dataclass(frozen=True, slots=True)
class Node:
    """One operation of a tensor graph.

    Parameters
    ----------
    id : str
        Unique within a graph; input nodes use the input's name.
    op : str
        Operator name, a key of `deepx_flow.ops.OPS`.
    inputs : tuple of str
        Ids of the operand nodes, in order.
    shape : tuple of int
        Output shape.
    dtype : str
        Output dtype, a NumPy name.
    attrs : tuple of (str, value)
        Sorted operator attributes (axis, seed, value, ...).
    """

    id: str
    op: str
    inputs: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    attrs: Attrs = ()

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n
