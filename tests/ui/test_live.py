"""A live page's refresh that fails says so in the page, and clears it once it works."""

from __future__ import annotations

from deepx_flow.ui.live import shown_failures
from deepx_flow.ui.text import Text


def test_a_failing_refresh_is_shown_then_cleared():
    pane, outcomes = Text(""), [RuntimeError("database is locked"), "running"]

    def refresh():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    guarded = shown_failures(refresh, pane)
    assert guarded() is None
    assert pane.object.startswith("refresh failed at ")
    assert pane.object.endswith("UTC: RuntimeError: database is locked")
    assert guarded() == "running" and pane.object == ""


def test_text_panes_escape_what_they_show():
    """Panel 1.9 renders a Str's text as HTML; Text escapes it first (what the browser
    gets is the escaped text, escaped once more for the HTML model)."""
    from html import unescape
    shown = Text("")._transform_object('<b id="x">1 & 2</b>')["object"]
    assert unescape(unescape(shown)) == '<pre><b id="x">1 & 2</b></pre>'
    assert unescape(shown) == '<pre>&lt;b id="x"&gt;1 &amp; 2&lt;/b&gt;</pre>'
