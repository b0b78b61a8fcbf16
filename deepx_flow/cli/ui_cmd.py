"""`deepx-flow ui`: serve the dashboard (on 127.0.0.1:5006 unless told otherwise).

Binding to any other address needs `--basic-auth` (a password, or a JSON file of
{user: password}) or `--oauth-provider` (Panel's OAuth; key and secret from
PANEL_OAUTH_KEY / PANEL_OAUTH_SECRET); without one it refuses, exit code 2.
"""

from __future__ import annotations

import os

from deepx_flow.ui.server import DEFAULT_ADDRESS, DEFAULT_PORT


def add_parser(sub, parents) -> None:
    p = sub.add_parser("ui", parents=parents, help="serve the dashboard")
    p.add_argument("--address", default=DEFAULT_ADDRESS,
                   help=f"address to listen on (default {DEFAULT_ADDRESS}; any other needs "
                        f"authentication)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="a Dask scheduler to show live (default DEEPX_SCHEDULER)")
    p.add_argument("--basic-auth", metavar="PASSWORD|FILE",
                   default=os.environ.get("PANEL_BASIC_AUTH"),
                   help="require a login: a JSON file of {user: password}, or a password "
                        "(prefer the file or PANEL_BASIC_AUTH: other users can read a "
                        "command line)")
    p.add_argument("--oauth-provider", default=os.environ.get("PANEL_OAUTH_PROVIDER"),
                   help="require an OAuth login (github, google, azure, generic, ...)")
    p.add_argument("--cookie-secret", default=os.environ.get("PANEL_COOKIE_SECRET"),
                   help="sign login cookies with this (default: random per start; prefer "
                        "PANEL_COOKIE_SECRET to the command line)")
    p.add_argument("--allow-websocket-origin", metavar="HOST[:PORT]", action="append",
                   default=[], help="a name browsers reach the dashboard by (a proxy, a DNS "
                                    "alias), when not on loopback; repeatable")


def run(args) -> int:
    from deepx_flow.config import settings
    from deepx_flow.ui.server import serve
    serve(db=args.db, address=args.address, port=args.port,
          scheduler=args.scheduler or settings().scheduler_address,
          basic_auth=args.basic_auth, oauth_provider=args.oauth_provider,
          cookie_secret=args.cookie_secret, allow_origins=args.allow_websocket_origin)
    return 0
