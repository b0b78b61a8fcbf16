"""The dashboard over a big metadata database: each page with 10,000 runs and 1,000,000 task
rows must render in under 2 s.

Why: the pages read the database on every visit (paged SQL, aggregates in SQL). A query that
scans a big table, or a page that loads a whole table into Python, shows up here first.

What runs:

- A fresh SQLite database seeded by `seed_dashboard.py` (bulk inserts; 10,000 runs, 1,000,000
  task rows, events, chunk placements, 64 workers with devices, storage tiers and 4,032 links,
  the registered operators, 200 assets x 50 versions with checks, 20 schedules with 50,000
  ticks). With DEEPX_BENCH_PG_URL set (a PostgreSQL server URL, like DEEPX_TEST_PG_URL), the
  same seed in a new database there too, dropped at the end.
- Every page of the dashboard (`ui/pages/__init__.PATHS`), plus detail variants: the run page
  for the big run (25,000 tasks, more than its timeline shows), a typical run (~100) and a
  failed one, and, where those pages exist, `graph?run=`, `graph?section=lineage` (the
  asset lineage tab), `assets?asset=`, `registry?section=network` (the link matrix and
  storage tiers tab), `registry?tensor=`, `schedules?schedule=`. A page whose module does
  not exist yet is reported as missing, one that fails as an error. First in the table,
  the run page of no run (`run?id=none`): what any page costs (Panel's scripts, the
  navigation bar).
- Two timings per page:
  1. server build: the route function building the page and Panel turning it into Bokeh
     models (`server_doc`), in this process, with the session's query arguments set as
     Panel sets them: wall and CPU seconds (CPU time is less disturbed by other jobs on a
     shared machine); the SQL it ran is timed too (count, seconds, the slowest statements,
     and the slowest one's query plan).
  2. browser: the dashboard served (`deepx_flow.ui.server.serve`) on loopback, headless
     Chromium (Playwright) timing from `page.goto` until Bokeh's document is idle (rendered).
     Per page, first a load in a new browser context, nothing cached ("cold": the first
     visit to the dashboard, reported apart); then the median of N loads in one context
     shared by every page, which has the scripts Panel and Bokeh serve cached from an
     untimed load of the runs page (a person going from page to page); also the CPU
     seconds the page's renderer process spent (Chromium's ProcessTime: less disturbed by
     other jobs on a shared machine than the wall time), the bytes the page's websocket
     received (the document: "doc MB"), JavaScript errors and any request off the server
     (the dashboard must not need a CDN).
  The target is on the browser median; without Chromium or Playwright only (1) is measured,
  and the target is judged on the server build.

Run: `python benchmarks/bench_ui.py [--quick] [--repeat N] [--no-wait]` (full: about 5
minutes, most of it seeding and loading pages; --quick, a smoke test: a hundredth of the rows,
one server build of every page, one browser load of each routed page, no cold loads, the detail
variants built on the server only; about 20 s).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import socket
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import common
import seed_dashboard

CHROMIUM = "/usr/bin/chromium"
TARGET_S = 2.0
IDLE = "() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle"


# --- what to measure -------------------------------------------------------------------------

def page_cases(seeded) -> list[SimpleNamespace]:
    """(label, path with query, module, whether it is a detail variant) for every routed page
    and the detail variants."""
    from deepx_flow.ui.pages import PATHS

    # The run page of no run: the cost of any page (Panel's scripts, the navigation bar).
    cases = [SimpleNamespace(label="(empty page: run?id=none)", path="run?id=none",
                             module="run", variant=False)]
    cases += [SimpleNamespace(label=path, path=path, module=path, variant=False)
              for path in PATHS if path != "run"]
    variants = [("run (big run)", f"run?id={seeded.big_run}"),
                ("run (typical run)", f"run?id={seeded.typical_run}"),
                ("run (failed run)", f"run?id={seeded.failed_run}"),
                ("graph (big run)", f"graph?run={seeded.big_run}"),
                ("graph (typical run)", f"graph?run={seeded.typical_run}"),
                ("assets (one asset)", f"assets?asset={seeded.asset}"),
                ("assets (partitioned)", f"assets?asset={seeded.partitioned_asset}"),
                ("graph (lineage)", "graph?section=lineage"),
                ("registry (network)", "registry?section=network"),
                ("registry (tensor)", f"registry?tensor={seeded.tensor}"),
                ("schedules (one)", f"schedules?schedule={seeded.schedule}")]
    for label, path in variants:
        module = urlsplit(path).path
        if module in PATHS:
            cases.append(SimpleNamespace(label=label, path=path, module=module, variant=True))
    for case in cases:
        case.exists = importlib.util.find_spec(f"deepx_flow.ui.pages.{case.module}") is not None
    return cases


# --- (1) the server building a page ----------------------------------------------------------

class SqlTimer:
    """Times every statement the engine runs while `recording`."""

    def __init__(self, engine):
        from sqlalchemy import event
        self.statements: list[tuple[float, str, object]] = []
        self.recording = False
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn, cursor, statement, parameters, context, executemany):
        conn.info.setdefault("deepx_bench_t", []).append(time.perf_counter())

    def _after(self, conn, cursor, statement, parameters, context, executemany):
        started = conn.info["deepx_bench_t"].pop()
        if self.recording:
            self.statements.append((time.perf_counter() - started, statement, parameters))

    @contextlib.contextmanager
    def record(self):
        self.statements, self.recording = [], True
        try:
            yield self
        finally:
            self.recording = False


def build_once(route, args: dict) -> tuple[float, float]:
    """Seconds (wall and this process's CPU) for `route()` plus `server_doc` in a document
    whose session has the query arguments `args`, as Panel's server gives them to the page
    (`pn.state.session_args`)."""
    import panel as pn
    from bokeh.document import Document

    doc = Document()
    request = SimpleNamespace(arguments=args, cookies={}, headers={})
    context = SimpleNamespace(request=request, id=uuid.uuid4().hex)
    doc._session_context = lambda: context
    token = pn.state._curdoc.set(doc)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        route().server_doc(doc)
        return time.perf_counter() - start, time.process_time() - cpu
    finally:
        pn.state._curdoc.reset(token)


def server_builds(db, cases, repeat: int) -> None:
    """Set `case.server` (first, median and every build's seconds, the SQL of the last one)
    or `case.error` for every case whose module exists."""
    from deepx_flow.ui.pages import pages

    routes = pages(db.url, None)
    sql = SqlTimer(db.engine)
    for case in cases:
        if not case.exists:
            continue
        split = urlsplit(case.path)
        args = {k: [v.encode() for v in vs] for k, vs in parse_qs(split.query).items()}
        times, cpu = [], []
        try:
            for _ in range(1 + repeat):
                with sql.record():
                    wall, used = build_once(routes[split.path], args)
                times.append(wall)
                cpu.append(used)
        except Exception as err:  # a page being written may fail: report it, go on
            case.error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            continue
        slowest = sorted(sql.statements, key=lambda s: -s[0])[:3]
        timed, timed_cpu = times[1:] or times, cpu[1:] or cpu  # repeat 0: the first alone
        case.server = {
            "first_s": times[0], "median_s": statistics.median(timed),
            "times_s": timed, "cpu_median_s": statistics.median(timed_cpu),
            "sql_s": sum(s[0] for s in sql.statements),
            "queries": len(sql.statements),
            "slowest_sql": [{"s": s, "statement": " ".join(stmt.split())[:600],
                             "parameters": repr(params)[:200]} for s, stmt, params in slowest],
            "slowest_plan": query_plan(db, *slowest[0][1:]) if slowest else None}


def query_plan(db, statement: str, parameters) -> list[str]:
    """The database's plan for one statement (EXPLAIN QUERY PLAN on SQLite, EXPLAIN on
    PostgreSQL), as text lines."""
    explain = "EXPLAIN QUERY PLAN " if db.is_sqlite else "EXPLAIN "
    try:
        with db.engine.connect() as conn:
            rows = conn.exec_driver_sql(explain + statement, parameters).all()
    except Exception as err:
        return [f"(no plan: {type(err).__name__}: {err})"]
    return [" | ".join(str(c) for c in row) for row in rows]


# --- (2) a browser rendering a page ----------------------------------------------------------

def browser_missing() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} is missing (apt install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard(url: str):
    """The dashboard served on a free loopback port: its base URL."""
    from deepx_flow.ui.server import serve
    port = free_port()
    # Sessions of closed pages go after 10 s, not Bokeh's 15 to 32: pages that refresh
    # themselves (overview, runs) keep reading the database until then, while the next page
    # is timed. Not sooner: a session unused that long after its HTML was sent would be made
    # again when the page connects, without the settings that serve the page's style sheets
    # locally.
    server = serve(db=url, port=port, threaded=True, check_unused_sessions_milliseconds=1000,
                   unused_session_lifetime_milliseconds=10_000)
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start in 60 s")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


VIEWPORT = {"width": 1400, "height": 900}


def load(context, base: str, path: str, timeout_s: float) -> dict:
    """One load of `path`: `seconds` from `goto` until Bokeh's document is idle (None: not
    within `timeout_s`); `renderer_cpu_s`, the CPU time the page's renderer process spent
    meanwhile (Chromium's own figure: what the page costs the browser, whatever else the
    machine runs); `websocket_bytes` received (the document, mostly); and `problems`
    (JavaScript errors, requests to anywhere but the server)."""
    page = context.new_page()
    problems, received = [], [0]

    def on_socket(ws):
        ws.on("framereceived", lambda frame: received.__setitem__(0, received[0] + len(frame)))

    page.on("websocket", on_socket)
    page.on("request", lambda r: problems.append(f"request off the server: {r.url}")
            if not r.url.startswith((base, "ws://127.0.0.1", "data:", "blob:")) else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: problems.append(f"console error: {m.text}")
            if m.type == "error" else None)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    out = {"seconds": None, "renderer_cpu_s": None, "problems": problems}
    try:
        before = _renderer_cpu(cdp)
        start = time.perf_counter()
        page.goto(f"{base}/{path}", timeout=timeout_s * 1000)
        page.wait_for_function(IDLE, timeout=timeout_s * 1000)
        out["seconds"] = time.perf_counter() - start
        out["renderer_cpu_s"] = _renderer_cpu(cdp) - before
    except Exception as err:  # playwright's TimeoutError, or the page never loading
        problems.append(f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
    finally:
        out["websocket_bytes"] = received[0]
        page.close()
    return out


def _renderer_cpu(cdp) -> float:
    metrics = cdp.send("Performance.getMetrics")["metrics"]
    return next(m["value"] for m in metrics if m["name"] == "ProcessTime")


def browser_loads(url: str, cases, repeat: int, timeout_s: float, cold: bool = True) -> None:
    """Set `case.browser` (the cold load's seconds, the median of the cached ones, every
    load, JavaScript errors) for every case that built on the server; without `cold`, only
    loads with the scripts cached."""
    from playwright.sync_api import sync_playwright
    # A page closed while its session still sends (the overview's refresh) leaves tornado a
    # WebSocketClosedError that asyncio would print as "Task exception was never retrieved".
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    with dashboard(url) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox"])
        try:
            cached = browser.new_context(viewport=VIEWPORT)
            load(cached, base, "runs", timeout_s)  # the context caches the scripts
            # The overview last: its closed pages keep refreshing for a while.
            for case in sorted(cases, key=lambda c: c.module == "overview"):
                if not hasattr(case, "server"):
                    continue
                first = None
                if cold:
                    fresh = browser.new_context(viewport=VIEWPORT)
                    try:
                        first = load(fresh, base, case.path, timeout_s)
                    finally:
                        fresh.close()
                done = [first] if first else []
                if first is None or first["seconds"] is not None:
                    for _ in range(repeat):
                        done.append(load(cached, base, case.path, timeout_s))
                        if done[-1]["seconds"] is None:
                            break
                timed = [d for d in (done[1:] if cold else done) if d["seconds"] is not None]
                case.browser = {
                    "cold_s": first["seconds"] if first else None,
                    "median_s": statistics.median(d["seconds"] for d in timed) if timed
                    else None,
                    "renderer_cpu_median_s": statistics.median(
                        d["renderer_cpu_s"] for d in timed) if timed else None,
                    "times_s": [d["seconds"] for d in timed],
                    "renderer_cpu_s": [d["renderer_cpu_s"] for d in timed],
                    "websocket_bytes": done[-1]["websocket_bytes"],
                    "problems": sorted({p for d in done for p in d["problems"]})[:10],
                    "timed_out": any(d["seconds"] is None for d in done)}
        finally:
            browser.close()


# --- one database, every page ----------------------------------------------------------------

def measure(url: str, scale, repeat_build: int, repeat_load: int, use_browser: bool,
            timeout_s: float, cold: bool = True, browser_variants: bool = True) -> dict:
    from deepx_flow.meta import open_db

    start = time.perf_counter()
    seeded = seed_dashboard.seed(url, scale)
    seed_s = time.perf_counter() - start
    print(f"seeded in {seed_s:.1f} s: " + ", ".join(f"{n:,} {t}"
                                                    for t, n in seeded.counts.items()))
    db = open_db(url)
    cases = page_cases(seeded)
    server_builds(db, cases, repeat_build)
    if use_browser:
        # Without `browser_variants` (--quick) the browser loads each routed page once; the
        # detail variants are built on the server only (each load costs 1-2 s here).
        shown = cases if browser_variants else [c for c in cases if not c.variant]
        browser_loads(url, shown, repeat_load, timeout_s, cold)
    return {"seed_s": seed_s, "counts": seeded.counts,
            "seeded": {k: v for k, v in vars(seeded).items() if k not in ("counts", "url")},
            "pages": [_result(c, use_browser) for c in cases]}


def _result(case, use_browser: bool) -> dict:
    out = {"page": case.label, "path": case.path}
    if not case.exists:
        return {**out, "status": "missing"}
    if hasattr(case, "error"):
        return {**out, "status": "error", "error": case.error}
    browser = getattr(case, "browser", None)
    out.update(status="ok", server=case.server, browser=browser)
    if browser:
        value = browser["median_s"]
        out["judged_on"] = "browser median"
    else:
        value = case.server["median_s"]
        out["judged_on"] = ("server build median (not loaded in the browser with --quick)"
                            if use_browser else "server build median (no browser)")
    out["seconds"] = value
    out["met"] = value is not None and value < TARGET_S
    return out


def print_pages(backend: str, result: dict, scale) -> None:
    rows = []
    for p in result["pages"]:
        server, browser = p.get("server") or {}, p.get("browser") or {}
        status = p["status"] if p["status"] != "ok" else ("ok" if p["met"] else "SLOW")
        if p["status"] == "ok" and browser.get("timed_out"):
            status = "TIMEOUT"
        mb = browser.get("websocket_bytes")
        rows.append((p["page"], common.fmt(server.get("median_s"), 3),
                     common.fmt(server.get("cpu_median_s"), 3),
                     common.fmt(server.get("sql_s"), 3), server.get("queries", "-"),
                     "-" if mb is None else f"{mb / 1e6:.2f}",
                     common.fmt(browser.get("cold_s"), 2),
                     common.fmt(browser.get("median_s"), 2),
                     common.fmt(browser.get("renderer_cpu_median_s"), 2), f"< {TARGET_S:g}",
                     status))
    common.print_table(
        ("page", "server build s", "cpu s", "its SQL s", "queries", "doc MB",
         "browser cold s", "browser median s", "renderer cpu s", "target s", "ok?"), rows,
        f"{backend}: {scale.runs:,} runs, {scale.tasks:,} task rows "
        f"(median of the timed builds and loads)")
    for p in result["pages"]:
        if p["status"] == "error":
            print(f"  {p['page']}: {p['error']}")
        for problem in (p.get("browser") or {}).get("problems", []):
            print(f"  {p['page']}: {problem}")
    for p in result["pages"]:
        server = p.get("server")
        if not server or not server["slowest_sql"] or server["slowest_sql"][0]["s"] < 0.1:
            continue
        top = server["slowest_sql"][0]
        print(f"\n{p['page']}: slowest SQL {top['s']:.3f} s of {server['sql_s']:.3f} s: "
              f"{top['statement'][:300]}")
        for line in server["slowest_plan"] or []:
            print(f"    plan: {line}")


@contextlib.contextmanager
def postgres_database(server: str):
    """A new database with a unique name on the PostgreSQL `server`; dropped on leaving."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    from deepx_flow.meta.db import close_all
    name = f"deepx_bench_ui_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(server).set(database=name).render_as_string(hide_password=False)
        finally:
            close_all()
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


def main(quick: bool = False, repeat: int | None = None, wait: bool = True) -> dict:
    scale = seed_dashboard.Scale.quick() if quick else seed_dashboard.Scale()
    # --quick is a smoke test: one build of each page, one load of each routed page (no cold
    # load; the detail variants are built on the server only).
    repeat_load = repeat or (1 if quick else 5)
    repeat_build = repeat or (0 if quick else 3)
    timeout_s = 30.0 if quick else 60.0
    missing = browser_missing()
    if missing:
        print(f"no browser: {missing}; measuring the server builds only")
    res = {"machine": common.machine_info(),
           "busy_before": None if quick or not wait else common.wait_until_quiet(),
           "parameters": {"scale": scale.as_dict(), "server_builds": repeat_build,
                          "browser_loads": repeat_load, "target_s": TARGET_S,
                          "browser": None if missing else "chromium (headless, playwright)",
                          "no_browser_reason": missing}}
    backends = {}
    with tempfile.TemporaryDirectory(prefix="deepx-bench-ui-") as tmp:
        url = f"sqlite:///{tmp}/deepx.db"
        backends["sqlite"] = measure(url, scale, repeat_build, repeat_load, not missing,
                                     timeout_s, not quick, not quick)
        print_pages("sqlite", backends["sqlite"], scale)
    pg_server = os.environ.get("DEEPX_BENCH_PG_URL")
    if pg_server:
        with postgres_database(pg_server) as url:
            backends["postgresql"] = measure(url, scale, repeat_build, repeat_load,
                                             not missing, timeout_s, not quick, not quick)
        print_pages("postgresql", backends["postgresql"], scale)
    res["backends"] = backends
    targets = {}
    for backend, result in backends.items():
        for p in result["pages"]:
            if p["status"] == "ok":
                targets[f"{backend}: {p['page']}"] = common.target(
                    f"{backend} {p['page']} < {TARGET_S:g} s ({p['judged_on']})",
                    p["seconds"], p["met"])
        measured = [p for p in result["pages"] if p["status"] == "ok"]
        worst = max((p["seconds"] or float("inf") for p in measured), default=float("inf"))
        targets[f"{backend}: every page"] = common.target(
            f"{backend}: every existing page < {TARGET_S:g} s (the slowest)", worst,
            bool(measured) and all(p["met"] for p in measured),
            missing=[p["page"] for p in result["pages"] if p["status"] == "missing"],
            errors=[p["page"] for p in result["pages"] if p["status"] == "error"])
    res["targets"] = targets
    common.write_results("bench_ui", res, quick)
    return res


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a hundredth of the rows")
    parser.add_argument("--repeat", type=int,
                        help="timed builds and browser loads per page (3 and 5; 1 and 1 with "
                             "--quick)")
    parser.add_argument("--no-wait", action="store_true",
                        help="do not wait for a quiet machine before timing")
    args = parser.parse_args()
    main(args.quick, args.repeat, not args.no_wait)
