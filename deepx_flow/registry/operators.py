"""Operator registration: every operator, its kind, engines, cost figures and fusability.

The table is `deepx_flow.ops.OPS`; this module is the registry's view of it, which
`deepx-flow ops` prints. (Third-party engines will add operators here through the
`deepx_flow.kernels` entry-point group.)
"""

from __future__ import annotations

from deepx_flow.ops import OPS, OpSpec


def operators() -> list[OpSpec]:
    return sorted(OPS.values(), key=lambda s: (s.kind, s.name))


def operator_table() -> str:
    rows = [("operator", "kind", "engines", "fuses", "flops/elem", "scratch B/elem",
             "description")]
    for spec in operators():
        rows.append((spec.name, spec.kind, ",".join(spec.engines), "yes" if spec.fusable
                     else "no", f"{spec.flops_per_element:g}",
                     f"{spec.temp_bytes_per_element:g}", spec.doc))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
