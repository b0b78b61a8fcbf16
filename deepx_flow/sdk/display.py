"""How a `dx.Tensor` shows itself in a notebook (`Tensor._repr_html_`).

A small table: the name, the operator, shape, dtype, size in bytes, how many nodes its graph
has, and what data its graph carries (dask arrays, NumPy operands). Plain HTML with every
value escaped, no scripts or style sheets, so it reads the same in Jupyter, VS Code and
a saved notebook. `repr(t)` stays the one line it was.
"""

from __future__ import annotations

from deepx_flow.registry.cluster import format_bytes
from deepx_flow.sdk.tensor import Tensor
from deepx_flow.text_table import html_facts


def graph_size(t: Tensor) -> tuple[int, int]:
    """(nodes, inputs bound to data) of the graph behind `t`, walked iteratively."""
    seen: set[str] = set()
    bound: set[str] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        if x.node.id in seen:
            continue
        seen.add(x.node.id)
        if x.data is not None:
            bound.add(x.node.id)
        stack.extend(x.parents)
    return len(seen), len(bound)


def tensor_html(t: Tensor) -> str:
    """The HTML table `Tensor._repr_html_` returns."""
    nodes, bound = graph_size(t)
    rows = [("op", t.node.op), ("shape", str(t.shape)), ("dtype", t.dtype),
            ("bytes", format_bytes(t.nbytes)),
            ("graph", f"{nodes:,} node{'s' if nodes != 1 else ''}"
                      + (f", {bound} bound to data" if bound else ""))]
    if t.data is not None:
        rows.append(("data", f"{t.data.kind} {t.data.token}"))
    return html_facts("dx.Tensor" + (f" {t.name}" if t.name else ""), rows)
