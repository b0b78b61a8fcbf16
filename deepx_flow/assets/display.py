"""How assets show themselves: `repr` one line each, and the tables a notebook shows for an
asset (`AssetDef._repr_html_`), a project (`Definitions._repr_html_`) and its status
(`StatusTable._repr_html_`)."""

from __future__ import annotations

from deepx_flow.text_table import html_facts, html_table


def _checks(a) -> str:
    return ", ".join(c.name + ("" if c.blocking else " (warns)") for c in a.checks) or "-"


def asset_facts(a) -> list[tuple[str, str]]:
    """What an asset is, as (name, value) rows."""
    return [("upstream", ", ".join(a.deps) or "-"),
            ("code version", a.code_version or "-"),
            ("partitions", str(a.partitions) if a.partitions is not None else "-"),
            ("checks", _checks(a)),
            ("storage", a.storage),
            ("description", a.description or "-")]


def asset_repr(a) -> str:
    facts = "; ".join(f"{k} {v}" for k, v in asset_facts(a)[:4] if v != "-")
    return f"<asset '{a.name}'{': ' + facts if facts else ''}>"


def asset_html(a) -> str:
    return html_facts(f"dx.asset '{a.name}'", asset_facts(a))


def definitions_repr(defs) -> str:
    return (f"<Definitions: {len(defs.assets)} asset(s) ({', '.join(defs.order)}), "
            f"{len(defs.schedules)} schedule(s)>")


def definitions_html(defs) -> str:
    rows = [(name, *(v for _, v in asset_facts(defs.assets[name])[:4]))
            for name in defs.order]
    out = html_table(("asset", "upstream", "code version", "partitions", "checks"), rows,
                     f"dx.Definitions: {len(defs.assets)} asset(s), upstream first")
    if defs.schedules:
        out += html_table(("schedule", "cron", "time zone", "materializes"),
                          [(s.name, s.cron, s.timezone, s.selection) for s in defs.schedules])
    return out


__all__ = ["asset_repr", "asset_html", "definitions_repr", "definitions_html"]
