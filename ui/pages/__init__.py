"""The dashboard's pages, one module each; `pages` gives the routes `pn.serve` takes.

Each route is a function called once per browser session, so every visitor gets their own
widgets and database reads."""

from __future__ import annotations

NAV = [("Runs", "runs")]


def pages(db_url: str, scheduler: str | None = None) -> dict:
    from deepx_flow.ui.pages.runs import runs_page

    def route(build):
        def page():
            import panel as pn

            from deepx_flow.meta import open_db
            nav = pn.Row(*[pn.pane.HTML(f'<a href="{path}">{title}</a>') for title, path in NAV],
                         css_classes=["deepx-nav"])
            return pn.Column(nav, build(open_db(db_url), scheduler), sizing_mode="stretch_width")
        return page

    runs = route(runs_page)
    return {"/": runs, "runs": runs}
