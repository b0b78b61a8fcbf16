"""Live pages: call a page's refresh periodically while its browser session is open."""

from __future__ import annotations

from typing import Callable

import panel as pn


def refresh_while_open(refresh: Callable[[], None], period_ms: int):
    """Call `refresh` every `period_ms` while this session lives (nothing when the page is
    built outside a server session, as in tests); returns the callback, or None."""
    doc = pn.state.curdoc
    if doc is None or doc.session_context is None:
        return None
    callback = pn.state.add_periodic_callback(refresh, period=period_ms)
    pn.state.on_session_destroyed(lambda _context: callback.stop())
    return callback
