"""What a browser session asked for: its URL's query arguments."""

from __future__ import annotations

import panel as pn


def session_arg(name: str) -> str:
    """The query argument `name` of this browser session ("" when missing)."""
    values = pn.state.session_args.get(name) or [b""]
    return values[0].decode("utf-8", "replace")
