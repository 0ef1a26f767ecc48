"""API keys: how a presented key is matched against the configured hashes.

Keys are configured only as SHA-256 hashes (``ONCEFLOW_API_KEYS``, :class:`ApiKey`);
a presented key is hashed and compared with every stored hash in constant time. Used
by ingest (``producers/auth.py``) and the console (``console/auth.py``), which must not
import each other.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

from onceflow.settings import ApiKey

__all__ = ["KeyRing", "hash_key", "new_key"]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "ofk_" + secrets.token_urlsafe(32)


class KeyRing:
    """The configured keys, by hash."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._keys = [(bytes.fromhex(k.sha256), k) for k in keys]

    def identify(self, presented: str) -> ApiKey | None:
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for stored, key in self._keys:  # no early exit: the time does not depend on which
            if hmac.compare_digest(digest, stored):
                found = key
        return found
