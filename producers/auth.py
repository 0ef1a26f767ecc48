"""API keys with scopes, for the ingest and admin endpoints.

Keys are configured only as SHA-256 hashes (``ONCEFLOW_API_KEYS``; ``onceflow keys new``
makes one); a presented key is hashed and compared with every stored hash in constant
time. A missing or unknown key gets 401; a key without the endpoint's scope gets 403.
Keys never appear in logs or error messages, only their names.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request

from onceflow.settings import SCOPES, ApiKey, Settings
from producers.models import RequestError

__all__ = ["SCOPES", "Authenticator", "hash_key", "new_key"]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "ofk_" + secrets.token_urlsafe(32)


class Authenticator:
    def __init__(self, settings: Settings) -> None:
        self.disabled = settings.auth_disabled
        self._keys = [(bytes.fromhex(k.sha256), k) for k in settings.api_keys]

    def identify(self, presented: str) -> ApiKey | None:
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for stored, key in self._keys:  # no early exit: the time does not depend on which
            if hmac.compare_digest(digest, stored):
                found = key
        return found

    def authenticate(self, request: Request, scope: str) -> str:
        """The caller's identity if its key holds ``scope``; else RequestError 401/403."""
        if self.disabled:
            return request.client.host if request.client else "anonymous"
        presented = _presented_key(request)
        if presented is None:
            raise _unauthorized("an API key is required")
        key = self.identify(presented)
        if key is None:
            raise _unauthorized("unknown API key")
        if scope not in key.scopes:
            raise RequestError(403, "forbidden", f"key {key.name!r} lacks scope {scope!r}")
        return key.name


def _unauthorized(message: str) -> RequestError:
    return RequestError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def _presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.headers.get("x-api-key") or None
