"""How a `dx.Tensor` shows itself in a notebook (`Tensor._repr_html_`).

A small table: the name, the operator, shape, dtype, size in bytes, how many nodes its graph
has, and what data its graph carries (dask arrays, NumPy operands). Plain HTML with every
value escaped, no scripts or style sheets, so it reads the same in Jupyter, VS Code and
a saved notebook. `repr(t)` stays the one line it was.
"""

from __future__ import annotations

import html

from deepx_flow.sdk.tensor import Tensor


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


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def tensor_html(t: Tensor) -> str:
    """The HTML table `Tensor._repr_html_` returns."""
    nodes, bound = graph_size(t)
    rows = [("op", t.node.op), ("shape", str(t.shape)), ("dtype", t.dtype),
            ("bytes", _bytes(t.nbytes)),
            ("graph", f"{nodes:,} node{'s' if nodes != 1 else ''}"
                      + (f", {bound} bound to data" if bound else ""))]
    if t.data is not None:
        rows.append(("data", f"{t.data.kind} {t.data.token}"))
    title = "dx.Tensor" + (f" <code>{html.escape(t.name)}</code>" if t.name else "")
    body = "".join(f"<tr><th style=\"text-align:left\">{html.escape(k)}</th>"
                   f"<td style=\"text-align:left\"><code>{html.escape(v)}</code></td></tr>"
                   for k, v in rows)
    return f"<div><strong>{title}</strong><table>{body}</table></div>"
