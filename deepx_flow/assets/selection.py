"""Asset selections, as in Dagster's selection syntax.

A selection is a string of terms separated by commas or spaces (or a list of terms):
- `name`: that asset; `*` alone: every asset;
- `+name`: it and its direct upstream; `++name` two levels up; `*name` all upstream;
- `name+`, `name++`, `name*`: the same downstream.
The result is in topological order (upstream first).
"""

from __future__ import annotations

import re

from deepx_flow.errors import InputError, did_you_mean

_TERM = re.compile(r"^(\*|\+*)([A-Za-z_][A-Za-z0-9_]*)(\*|\+*)$")


def select(defs, selection) -> list[str]:
    """The asset names `selection` picks from `defs` (a Definitions)."""
    terms = selection if isinstance(selection, (list, tuple, set)) else \
        re.split(r"[,\s]+", str(selection).strip())
    chosen: set[str] = set()
    for term in (t for t in terms if t):
        if term == "*":
            chosen.update(defs.assets)
            continue
        match = _TERM.match(term)
        if not match:
            raise InputError(f"cannot read asset selection term {term!r} (use name, +name, "
                             f"name+, *name or name*)")
        up, name, down = match.groups()
        if name not in defs.assets:
            raise InputError(f"no asset named {name!r}{did_you_mean(name, defs.assets)}")
        chosen.add(name)
        chosen |= _walk(name, up, lambda n: defs.assets[n].deps)
        chosen |= _walk(name, down, defs.downstream)
    return [name for name in defs.order if name in chosen]


def _walk(start: str, marks: str, neighbours) -> set[str]:
    depth = None if marks == "*" else len(marks)
    found, frontier, level = set(), {start}, 0
    while frontier and (depth is None or level < depth):
        frontier = {n for f in frontier for n in neighbours(f)} - found
        found |= frontier
        level += 1
    return found
