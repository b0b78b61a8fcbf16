"""Serving the dashboard: loopback needs no login, any other address needs authentication
(refused without it, before anything listens), and with basic auth a visitor without a
login is sent to the login page and the page's websocket is closed to them."""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse

import pytest

from deepx_flow.cli.main import main
from deepx_flow.errors import InputError
from deepx_flow.ui.server import CSP, HEADERS, check_bind, is_loopback, serve
from tests.helpers import free_port


@pytest.mark.parametrize("address,loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("", False), ("::", False),
    ("192.168.1.20", False), ("10.0.0.1", False), ("example.org", False),
    ("localhost.evil.example", False)])
def test_which_addresses_are_loopback(address, loopback):
    assert is_loopback(address) is loopback


def test_a_non_loopback_bind_without_authentication_is_refused():
    for address in ("0.0.0.0", "192.168.1.20", "::"):
        with pytest.raises(InputError, match=f"refusing to serve the dashboard on {address} "
                                             f"without authentication"):
            check_bind(address)
        check_bind(address, basic_auth="s3cret")  # with a login it may
        check_bind(address, oauth_provider="github")
    check_bind("127.0.0.1")


def test_the_command_refuses_before_anything_listens(capsys, tmp_path):
    port = free_port()
    code = main(["ui", "--address", "0.0.0.0", "--port", str(port),
                 "--db", f"sqlite:///{tmp_path / 'deepx.db'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("deepx-flow: error: refusing to serve the dashboard on 0.0.0.0")
    with pytest.raises(OSError):  # nothing is listening there
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def request(port: int, method: str, path: str, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def wait_until_serving(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            request(port, "GET", "/login")
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the dashboard did not start in 60 s")


@pytest.mark.slow
def test_with_basic_auth_a_visitor_must_log_in(tmp_path):
    port = free_port()
    server = serve(db=f"sqlite:///{tmp_path / 'deepx.db'}", port=port,
                   basic_auth={"ann": "s3cret"}, threaded=True)
    try:
        wait_until_serving(port)
        status, headers, _ = request(port, "GET", "/runs")
        assert status == 302 and "login" in headers["Location"]
        # The websocket that carries the page is refused without a login.
        status, _, _ = request(port, "GET", "/runs/ws", headers={
            "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Origin": f"http://127.0.0.1:{port}"})
        assert status in (401, 403)
        # A wrong password gets no cookie; the right one does, and then the page.
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        status, headers, _ = request(port, "POST", "/login", urllib.parse.urlencode(
            {"username": "ann", "password": "wrong"}), form)
        assert not [c for c in headers.get_all("Set-Cookie") or () if c.startswith("user=")]
        status, headers, _ = request(port, "POST", "/login", urllib.parse.urlencode(
            {"username": "ann", "password": "s3cret"}), form)
        cookies = "; ".join(c.split(";")[0] for c in headers.get_all("Set-Cookie"))
        assert "user=" in cookies
        status, _, body = request(port, "GET", "/runs", headers={"Cookie": cookies})
        assert status == 200 and b"bokeh" in body.lower()
        # The login page, its redirect and the page behind it: every response carries the
        # Content-Security-Policy and refuses framing.
        for method, path, cookie in (("GET", "/runs", ""), ("GET", "/login", ""),
                                     ("GET", "/runs", cookies)):
            _, headers, _ = request(port, method, path, headers={"Cookie": cookie})
            assert {name: headers[name] for name in HEADERS} == HEADERS, path
    finally:
        server.stop()


def test_the_policy_allows_only_this_server_and_no_framing():
    policy = dict(part.split(" ", 1) for part in CSP.split("; "))
    assert policy["default-src"] == "'self'" and policy["frame-ancestors"] == "'none'"
    assert policy["object-src"] == "'none'" and policy["form-action"] == "'self'"
    assert HEADERS["X-Frame-Options"] == "DENY"
    # Nothing but this server, inline code (Bokeh's), eval (its CustomJS) and the blob:
    # modules Panel makes; no other host, scheme or wildcard.
    allowed = {"'self'", "'none'", "'unsafe-inline'", "'unsafe-eval'", "blob:", "data:"}
    assert {s for sources in policy.values() for s in sources.split()} <= allowed


def test_websocket_origins_never_allow_any_host():
    import socket

    from deepx_flow.ui.server import websocket_origins
    assert websocket_origins("10.1.2.3", 5006) == ["10.1.2.3:5006"]
    assert websocket_origins("0.0.0.0", 80, ["dash.example.org", "proxy:443"]) == list(
        dict.fromkeys([f"{socket.getfqdn()}:80", f"{socket.gethostname()}:80",
                       "dash.example.org:80", "proxy:443"]))
    assert not any(o.startswith("*") for o in websocket_origins("::", 5006, ["a"]))
