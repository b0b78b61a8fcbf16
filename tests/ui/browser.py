"""Opening a dashboard page in the test browser and collecting what went wrong."""

from __future__ import annotations

import os
from pathlib import Path

ARTIFACTS = Path(os.environ.get("DEEPX_TEST_ARTIFACTS",
                                Path(__file__).resolve().parents[2] / ".test-artifacts"))
IDLE = "() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle"


def visit(browser, base: str, path: str, shot: str):
    """Open `path`; wait until Bokeh has rendered it; screenshot it to ARTIFACTS/`shot`.png;
    return the page and what went wrong (JavaScript errors, console errors, requests to
    anywhere but the server). Screenshot again with `screenshot(page, shot)` after waiting
    for something."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: problems.append(f"console error: {m.text}")
            if m.type == "error" else None)
    page.on("request", lambda r: problems.append(f"request off the server: {r.url}")
            if not r.url.startswith((base, "data:", "blob:")) else None)
    page.goto(f"{base}/{path}")
    page.wait_for_function(IDLE, timeout=30_000)
    screenshot(page, shot)
    return page, problems


def screenshot(page, shot: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{shot}.png"), full_page=True)


# Panel renders each pane inside a shadow root, which innerText does not enter.
PAGE_TEXT = """() => {
  const parts = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { parts.push(node.textContent); return; }
    if (node.nodeName === 'STYLE' || node.nodeName === 'SCRIPT') return;
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) walk(child);
  };
  walk(document.body);
  return parts.join(' ');
}"""


def page_text(page) -> str:
    """All the text the page shows, shadow roots included, whitespace collapsed."""
    return " ".join(page.evaluate(PAGE_TEXT).split())


def wait_for_text(page, text: str, timeout_s: float = 15) -> None:
    """Wait until the page shows `text` (whitespace collapsed), e.g. after a refresh."""
    import json
    page.wait_for_function(f"() => ({PAGE_TEXT})().split(/\\s+/).join(' ')"
                           f".includes({json.dumps(' '.join(text.split()))})",
                           timeout=timeout_s * 1000)


def shown_run_id(page) -> str:
    """The id a run page is showing (its heading's Str pane)."""
    return page.locator(".deepx-run-id pre").inner_text().strip()


# The on-screen box of the Bokeh figure named `name` (null when it is not drawn: hidden,
# or no such figure): Bokeh's view of the model, found among the document's views.
FIGURE_BOX = """(name) => {
  const model = Bokeh.documents[0].get_model_by_name(name);
  const views = [];
  const walk = (v) => { views.push(v); for (const c of v.child_views ?? []) walk(c); };
  for (const v of Object.values(Bokeh.index)) walk(v);
  const view = views.find((v) => v.model === model);
  if (!view || !view.el.isConnected) return null;
  const box = view.el.getBoundingClientRect();
  return box.width > 0 && box.height > 0 ? {width: box.width, height: box.height} : null;
}"""


def figure_box(page, name: str) -> dict | None:
    """Where the Bokeh figure named `name` is drawn ({width, height}), or None."""
    return page.evaluate(FIGURE_BOX, name)
