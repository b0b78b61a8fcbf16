"""Text panes that show text as typed.

Panel 1.9 puts a `Str` pane's text into the page as HTML (inside <pre>), so a run's error,
a tensor key or a URL argument holding markup would become markup. `Text` escapes it
first; the dashboard uses it for every text that is not fixed in the code."""

from __future__ import annotations

import html

import panel as pn


class Text(pn.pane.Str):
    """A `pn.pane.Str` whose text is shown literally (escaped before Panel renders it)."""

    def _transform_object(self, obj):
        if obj is None or obj == "":
            return super()._transform_object(obj)
        return super()._transform_object(html.escape(str(obj), quote=False))
