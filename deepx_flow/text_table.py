"""Plain-text tables for the CLI and for notebook reprs."""

from __future__ import annotations

import datetime as dt


def text_table(headers, rows, title: str | None = None) -> str:
    """Columns padded to their widest cell, a rule under the headers."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r]
                                           for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if title:
        lines.insert(0, title)
    return "\n".join(lines)


def local_time(t: float | None, missing: str = "-") -> str:
    """Seconds since the epoch as local wall time for a table cell; `missing` for none."""
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else missing
