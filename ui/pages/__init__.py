"""The dashboard's pages, one module each; `pages` gives the routes `pn.serve` takes.

Each route is a function called once per browser session, so every visitor gets their own
widgets and database reads. A page module `ui/pages/<path>.py` has one function
`<path>_page(db, scheduler)` that builds the page."""

from __future__ import annotations

import importlib

# (title in the navigation bar, URL path); the run page is reached from the runs page.
NAV = [("Overview", "overview"), ("Runs", "runs"), ("Graph", "graph"), ("Assets", "assets"),
       ("Registry", "registry"), ("Schedules", "schedules"), ("Serving", "serving")]
PATHS = [path for _, path in NAV] + ["run"]


def page_builder(path: str):
    """The function that builds the page at `path`."""
    module = importlib.import_module(f"deepx_flow.ui.pages.{path}")
    return getattr(module, f"{path}_page")


def pages(db_url: str, scheduler: str | None = None) -> dict:
    def route(path):
        def page():
            import panel as pn

            from deepx_flow.meta import open_db
            nav = pn.Row(*[pn.pane.HTML(f'<a href="{p}">{title}</a>') for title, p in NAV],
                         css_classes=["deepx-nav"])
            build = page_builder(path)
            return pn.Column(nav, build(open_db(db_url), scheduler),
                             sizing_mode="stretch_width")
        return page

    routes = {path: route(path) for path in PATHS}
    routes["/"] = routes["overview"]
    return routes
