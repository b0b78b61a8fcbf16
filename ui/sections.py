"""A page in tabs, each built when first opened.

A page holding several big plots took longer than the 2 s a page may take (the registry's
64-worker link matrix and 4,000-chunk grid together: 2.2-2.4 s); one tab each keeps every
view under it. A tab's content is built (its database reads, its figures) only when it is
first opened, and the browser gets only the open tab's (`dynamic`). The tab to open comes
from the URL (`?section=<name>`), so every tab has an address.
"""

from __future__ import annotations

from typing import Callable

import panel as pn

from deepx_flow.ui.text import Text


def section_tabs(sections: list[tuple[str, str, Callable[[], list]]], wanted: str,
                 page: str) -> list:
    """The parts of `page` in tabs (CSS class deepx-<page>-tabs): (name, title, build) per
    tab, where `build()` gives the tab's panes; the tab named `wanted` opens first (the
    first tab when `wanted` is empty, or unknown: a line above the tabs says so)."""
    css_class = f"deepx-{page}-tabs"
    names = [name for name, _, _ in sections]
    unknown = bool(wanted) and wanted not in names
    tabs = pn.Tabs(*[(title, pn.Column(sizing_mode="stretch_width"))
                     for _, title, _ in sections],
                   active=names.index(wanted) if wanted in names else 0, dynamic=True,
                   css_classes=[css_class], sizing_mode="stretch_width")

    def open_section(index: int) -> None:
        content = tabs[index]
        if not content.objects:  # built once, when first opened
            content.objects = sections[index][2]()

    tabs.param.watch(lambda event: open_section(event.new), "active")
    open_section(tabs.active)
    if not unknown:
        return [tabs]
    return [Text(f"no section {wanted!r}: the {page} page has " + ", ".join(names)
                 + f" ({page}?section=<name>)", css_classes=[f"{css_class}-unknown"]), tabs]
