"""API keys with scopes, for the ingest and admin endpoints.

Keys are configured only as SHA-256 hashes (``ONCEFLOW_API_KEYS``; ``onceflow keys new``
makes one); a presented key is matched by ``onceflow.keys.KeyRing`` (constant time,
shared with the console). A missing or unknown key gets 401; a key without the
endpoint's scope gets 403.
Keys never appear in logs or error messages, only their names.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Request

from onceflow.keys import KeyRing, hash_key, new_key
from onceflow.settings import SCOPES, ApiKey, Settings
from producers.models import RequestError

__all__ = ["SCOPES", "Authenticator", "hash_key", "new_key"]


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self.disabled = settings.auth_disabled
        self._ring = KeyRing(settings.api_keys)

    def identify(self, presented: str) -> ApiKey | None:
        return self._ring.identify(presented)

    def claimed_name(self, headers: Mapping[str, str]) -> str:
        """Who a refused request says it is, for the audit trail: its key's name, or
        ``(no key)`` / ``(unknown key)``; never the key."""
        presented = _presented_key(headers)
        if presented is None:
            return "(no key)"
        key = self.identify(presented)
        return key.name if key is not None else "(unknown key)"

    def authenticate(self, request: Request, scope: str) -> str:
        """The caller's identity if its key holds ``scope``; else RequestError 401/403."""
        return self.check(request.headers, request.client.host if request.client else None, scope)

    def check(self, headers: Mapping[str, str], host: str | None, scope: str) -> str:
        """:meth:`authenticate` from the request's headers (lower-case names) and peer
        address: what the submit front (``jobs.SubmitApp``) has at hand without a ``Request``."""
        if self.disabled:
            return host or "anonymous"
        presented = _presented_key(headers)
        if presented is None:
            raise _unauthorized("an API key is required")
        key = self.identify(presented)
        if key is None:
            raise _unauthorized("unknown API key")
        if scope not in key.scopes:
            raise RequestError(403, "forbidden", f"key {key.name!r} lacks scope {scope!r}")
        return key.name

    def holds(self, headers: Mapping[str, str], scope: str) -> bool:
        """Whether the request's key (already let in by :meth:`check` for another scope)
        also holds ``scope``; always, with auth off."""
        if self.disabled:
            return True
        presented = _presented_key(headers)
        key = self.identify(presented) if presented is not None else None
        return key is not None and scope in key.scopes


def _unauthorized(message: str) -> RequestError:
    return RequestError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def _presented_key(headers: Mapping[str, str]) -> str | None:
    header = headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return headers.get("x-api-key") or None
