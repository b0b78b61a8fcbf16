"""Live pages: call a page's refresh periodically while its browser session is open."""

from __future__ import annotations

import time
from typing import Callable

import panel as pn

from deepx_flow.ui.table import utc_text


def refresh_while_open(refresh: Callable[[], None], period_ms: int):
    """Call `refresh` every `period_ms` while this session lives (nothing when the page is
    built outside a server session, as in tests); returns the callback, or None."""
    doc = pn.state.curdoc
    if doc is None or doc.session_context is None:
        return None
    callback = pn.state.add_periodic_callback(refresh, period=period_ms)
    pn.state.on_session_destroyed(lambda _context: callback.stop())
    return callback


def failure_text(err: BaseException) -> str:
    """What a page shows when its refresh failed (it keeps trying)."""
    return f"refresh failed at {utc_text(time.time())} UTC: {type(err).__name__}: {err}"


def shown_failures(refresh: Callable[[], object], pane) -> Callable[[], object]:
    """`refresh`, with a failure shown in `pane` (a Text) instead of raised: a live page
    that stops updating must say why. Returns what `refresh` returns (None on failure)."""
    def guarded():
        try:
            result = refresh()
        except Exception as err:
            pane.object = failure_text(err)
            return None
        pane.object = ""
        return result
    return guarded
