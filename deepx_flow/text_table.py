"""Tables for the CLI (plain text) and for notebook reprs (plain HTML: every value escaped,
no scripts or style sheets, so it reads the same in Jupyter, VS Code and a saved notebook).

Text tables show control characters in names as escapes (`terminal_text.escaped`): a cell
is one line, and a name cannot act on the terminal it is printed to."""

from __future__ import annotations

import datetime as dt
import html

from deepx_flow.terminal_text import escaped


def text_table(headers, rows, title: str | None = None) -> str:
    """Columns padded to their widest cell, a rule under the headers; control characters
    in cells and the title escaped (before padding, so that columns line up)."""
    cells = [[escaped(str(h)) for h in headers]] + [
        ["" if c is None else escaped(str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if title:
        lines.insert(0, escaped(title))
    return "\n".join(lines)


def html_table(headers, rows, title: str | None = None, css_class: str = "") -> str:
    """An HTML table with a header row; `title` (plain text) above it."""
    esc = html.escape
    head = "".join(f"<th style=\"text-align:left\">{esc(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td style=\"text-align:left\">"
                                    f"{esc('' if c is None else str(c))}</td>" for c in row)
                   + "</tr>" for row in rows)
    caption = f"<strong>{esc(title)}</strong>" if title else ""
    return (f"<div class=\"{esc(css_class)}\">{caption}<table><tr>{head}</tr>{body}</table>"
            "</div>")


def html_facts(title: str, facts, css_class: str = "") -> str:
    """An HTML table of (name, value) rows under a bold `title` (plain text)."""
    esc = html.escape
    body = "".join(f"<tr><th style=\"text-align:left\">{esc(str(k))}</th>"
                   f"<td style=\"text-align:left\"><code>{esc(str(v))}</code></td></tr>"
                   for k, v in facts)
    return (f"<div class=\"{esc(css_class)}\"><strong>{esc(title)}</strong><table>{body}"
            "</table></div>")


def local_time(t: float | None, missing: str = "-") -> str:
    """Seconds since the epoch as local wall time for a table cell; `missing` for none."""
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else missing
