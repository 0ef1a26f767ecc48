"""Who is looking, and may they act: API keys in a cookie, scopes, and CSRF.

The operator pastes an API key once (``/login``); it is kept in an HttpOnly,
SameSite=Strict cookie (Secure over https) and checked on every request against
``ONCEFLOW_API_KEYS`` (``onceflow.keys.KeyRing``, constant time). ``jobs:read``
shows the pages; ``instances:control`` is needed to act.

CSRF is a double-submit token: a random ``onceflow_console_csrf`` cookie, echoed by
every POST in the form field ``csrf_token`` or the header ``X-CSRF-Token`` (htmx sends
it from ``<body hx-headers>``). Another site can neither read the cookie nor, with
SameSite=Strict, make the browser send it. ``ONCEFLOW_AUTH_DISABLED`` skips the key,
never the CSRF check.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request

from onceflow.errors import OnceflowError
from onceflow.keys import KeyRing
from onceflow.settings import Settings

__all__ = [
    "CONTROL",
    "CSRF_COOKIE",
    "KEY_COOKIE",
    "READ",
    "Denied",
    "Gatekeeper",
    "Principal",
]

KEY_COOKIE = "onceflow_console_key"
CSRF_COOKIE = "onceflow_console_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
READ = "jobs:read"
CONTROL = "instances:control"


class Denied(OnceflowError):
    """The request may not go on: 401 (no or unknown key), 403 (scope, CSRF)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: frozenset[str]

    def may(self, scope: str) -> bool:
        return scope in self.scopes


class Gatekeeper:
    def __init__(self, settings: Settings) -> None:
        self.disabled = settings.auth_disabled
        self._ring = KeyRing(settings.api_keys)

    def check_key(self, presented: str) -> Principal | None:
        key = self._ring.identify(presented)
        return Principal(key.name, frozenset(key.scopes)) if key else None

    def principal(self, request: Request) -> Principal | None:
        if self.disabled:
            return Principal("anonymous (auth disabled)", frozenset({READ, CONTROL}))
        presented = request.cookies.get(KEY_COOKIE)
        return self.check_key(presented) if presented else None

    def require(self, request: Request, scope: str) -> Principal:
        who = self.principal(request)
        if who is None:
            raise Denied(401, "log in with an API key")
        if not who.may(scope):
            raise Denied(403, f"key {who.name!r} lacks scope {scope!r}")
        return who


def csrf_token(request: Request) -> str:
    """The request's CSRF token: the cookie's, or a new one (set by the middleware)."""
    token = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_csrf", None)
    if not token:
        token = secrets.token_urlsafe(32)
        request.state.new_csrf = token
    return token


def check_csrf(request: Request, form: dict[str, str]) -> None:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER, "")
    if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise Denied(403, "missing or wrong CSRF token: reload the page and try again")


def is_https(request: Request) -> bool:
    return request.url.scheme == "https"
