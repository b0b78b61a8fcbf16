"""Serving the dashboard: `deepx-flow ui` (or `deepx_flow.ui.serve`) on 127.0.0.1:5006.

The pages only read the metadata database (and the Dask scheduler's public API when one is
given); nothing they show is ever executed. On loopback no login is asked for: whoever can
reach 127.0.0.1 can already read the database file. Any other address must come with
authentication (Panel's basic auth, or OAuth through Panel's `oauth_provider`); without it
the server refuses to start, naming the address.

Every script and style sheet is served by the dashboard itself (Panel's "server"
resources), so it works on machines with no way out to a CDN.

Every response carries a Content-Security-Policy (`CSP`) and `X-Frame-Options: DENY`: a
page may load scripts, styles, images and fonts from the dashboard only, talk to the
dashboard only (its websocket included), and be framed by no site (no clickjacking). Bokeh
and Panel need what the policy still allows: inline scripts and styles (the page's
bootstrap, Panel's stylesheets), `eval` (Bokeh compiles CustomJS, such as the timeline's
hover, with `new Function`), and modules from `blob:` URLs (Panel loads our tables' code so).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket

from deepx_flow.errors import InputError

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 5006
CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval' blob:",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    # 'self' takes in ws:// and wss:// to this host (CSP level 3); Panel's module loader
    # (es-module-shims) fetches the modules it made from blob: URLs.
    "connect-src 'self' blob:",
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",  # the login form posts here
    "frame-ancestors 'none'",
])
HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


def security_headers():
    """A Tornado output transform (the class) that gives every response `HEADERS`, unless
    the handler set its own."""
    from tornado.web import OutputTransform

    class SecurityHeaders(OutputTransform):
        def transform_first_chunk(self, status_code, headers, chunk, finishing):
            for name, value in HEADERS.items():
                if name not in headers:
                    headers[name] = value
            return status_code, headers, chunk

    return SecurityHeaders


def is_loopback(address: str) -> bool:
    """Whether binding to `address` keeps the server on this machine. "0.0.0.0", "" and
    host names other than localhost are not (a name may resolve anywhere)."""
    if address in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(address: str, basic_auth=None, oauth_provider: str | None = None) -> None:
    """Refuse a non-loopback `address` without authentication."""
    if is_loopback(address) or basic_auth or oauth_provider:
        return
    raise InputError(
        f"refusing to serve the dashboard on {address or 'every address'} without "
        f"authentication: anyone who can reach it could read every run; give --basic-auth "
        f"(a password, or a JSON file of user: password) or --oauth-provider, or bind to "
        f"127.0.0.1")


def websocket_origins(address: str, port: int, allow_origins=()) -> list[str]:
    """The pages whose scripts may open the dashboard's websocket: the bound address and,
    for a wildcard bind (0.0.0.0, ::), this host's names, plus `allow_origins` (HOST or
    HOST:PORT, e.g. a proxy's name). Never "any host": that would let any site a logged-in
    user visits talk to the dashboard (cross-site websocket hijacking)."""
    hosts = [address]
    if address in ("0.0.0.0", "::", ""):
        hosts = [socket.getfqdn(), socket.gethostname()]
    origins = [f"{h}:{port}" for h in hosts if h]
    origins += [o if ":" in o else f"{o}:{port}" for o in allow_origins or ()]
    return list(dict.fromkeys(origins))


def serve(db: str | None = None, address: str = DEFAULT_ADDRESS, port: int = DEFAULT_PORT,
          scheduler: str | None = None, basic_auth=None, oauth_provider: str | None = None,
          cookie_secret: str | None = None, allow_origins=(), threaded: bool = False,
          **panel_options):
    """Serve the dashboard; blocks unless `threaded` (then returns the server thread, with
    `.stop()`).

    Parameters
    ----------
    db : str, optional
        Metadata database URL (default DEEPX_DB_URL, else `.deepx/deepx.db`).
    address, port : where to listen (default 127.0.0.1:5006).
    scheduler : str, optional
        A Dask scheduler's address, for live workers and a link to its dashboard.
    basic_auth : str or dict, optional
        A password, a JSON file of {user: password}, or such a dict (Panel's basic auth).
    oauth_provider : str, optional
        Panel's OAuth (github, google, azure, generic, ...); its key and secret come from
        PANEL_OAUTH_KEY / PANEL_OAUTH_SECRET.
    cookie_secret : str, optional
        Signs login cookies (default: a random one, so logins end when the server stops).
    allow_origins : list of str, optional
        HOST[:PORT] that browsers reach the dashboard at, when bound to another address
        than loopback (see `websocket_origins`).
    """
    import panel as pn

    from deepx_flow.meta import open_db
    from deepx_flow.ui.pages import pages

    check_bind(address, basic_auth, oauth_provider)
    database = open_db(db)  # a bad URL fails here, once, not in every page
    if os.environ.get("BOKEH_RESOURCES", "server") != "server":
        raise InputError("BOKEH_RESOURCES must be 'server' (or unset): the dashboard serves "
                         "its own scripts and must not need a CDN")
    auth = {}
    if basic_auth or oauth_provider:
        auth = {"cookie_secret": cookie_secret or secrets.token_urlsafe(32)}
        if basic_auth:
            auth["basic_auth"] = basic_auth
        if oauth_provider:
            auth["oauth_provider"] = oauth_provider
    origin = [] if is_loopback(address) else websocket_origins(address, port, allow_origins)
    transforms = [security_headers(), *panel_options.pop("transforms", ())]
    return pn.serve(pages(database.url, scheduler), address=address, port=port, show=False,
                    threaded=threaded, title="deepx_flow", websocket_origin=origin or None,
                    transforms=transforms, **auth, **panel_options)
