"""Who may call the gateway: anyone on loopback when no credentials are set; otherwise a
bearer token (`--auth-token`) or the dashboard's basic auth (`--basic-auth`: a password, or
a JSON file of {user: password}). A gateway bound to any other address than loopback must
have one of them, or it refuses to start.

Secrets are compared in constant time (`hmac.compare_digest`), so the time an answer takes
says nothing of how much of a guess was right.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from dataclasses import dataclass
from pathlib import Path

from deepx_flow.errors import InputError
from deepx_flow.ui.server import is_loopback


@dataclass(frozen=True)
class Credentials:
    """What a request must carry: a bearer token, or a user and password of `users`."""

    token: str | None = None
    users: dict | None = None  # user -> password; {"": password} takes any user name

    @property
    def required(self) -> bool:
        return bool(self.token or self.users)

    def allows(self, authorization: str | None) -> bool:
        """Whether a request with this `Authorization` header value may call."""
        if not self.required:
            return True
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer" and self.token:
            return hmac.compare_digest(value.encode(), self.token.encode())
        if scheme == "basic" and self.users:
            try:
                user, _, password = base64.b64decode(value, validate=True).decode() \
                    .partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            want = self.users.get(user, self.users.get(""))
            # compared even for an unknown user, so that the answer takes as long
            return hmac.compare_digest(password.encode(), (want or "\0").encode()) \
                and want is not None
        return False


def credentials(auth_token: str | None = None, basic_auth: str | None = None) -> Credentials:
    """The credentials the command line gives: `basic_auth` is a password or the path of a
    JSON file of {user: password} (an InputError names a file that cannot be read)."""
    users = None
    if basic_auth:
        path = Path(basic_auth)
        if basic_auth.endswith(".json") or path.is_file():
            try:
                users = json.loads(path.read_text())
            except (OSError, ValueError) as err:
                raise InputError(f"--basic-auth {basic_auth}: cannot be read as a JSON file "
                                 f"of user: password ({err})") from None
            if not isinstance(users, dict) or not users or not all(
                    isinstance(k, str) and isinstance(v, str) and v for k, v in users.items()):
                raise InputError(f"--basic-auth {basic_auth}: not a JSON object of user: "
                                 f"password (non-empty strings)")
        else:
            users = {"": basic_auth}
    if auth_token is not None and not auth_token:
        raise InputError("--auth-token is empty")
    return Credentials(token=auth_token or None, users=users)


def check_bind(address: str, creds: Credentials) -> None:
    """Refuse a non-loopback `address` without credentials."""
    if is_loopback(address) or creds.required:
        return
    raise InputError(
        f"refusing to serve the gateway on {address or 'every address'} without "
        f"authentication: anyone who can reach it could run graphs and read every result; "
        f"give --auth-token (or DEEPX_GATEWAY_TOKEN) or --basic-auth, or bind to 127.0.0.1")
