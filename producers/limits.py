"""Per-client limits at the edge, so that one flooding or slow client cannot starve the
others: a token bucket (sustained rate and burst) and a cap on requests in flight.

The client is the API key's name, or the peer address when auth is disabled. State is
per ingest process (each replica limits on its own) and bounded in size.
"""

from __future__ import annotations

import time
from collections import Counter

MAX_TRACKED_CLIENTS = 10_000


class ClientLimiter:
    def __init__(self, rate: float, burst: int, max_inflight: int) -> None:
        self.rate = rate
        self.burst = burst
        self.max_inflight = max_inflight
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, last time)
        self.inflight: Counter[str] = Counter()

    def retry_after(self, client: str, now: float | None = None) -> float | None:
        """Take a token for ``client``; None if allowed, else seconds until one is free."""
        if self.rate <= 0:
            return None
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self._buckets[client] = (tokens - 1.0, now)
        if len(self._buckets) > MAX_TRACKED_CLIENTS:
            self._evict(now)
        return None

    def _evict(self, now: float) -> None:
        full_after = self.burst / self.rate if self.rate else 0.0
        for client, (_, last) in list(self._buckets.items()):
            if now - last > full_after:  # its bucket would be full again: forget it
                del self._buckets[client]

    def slot(self, client: str) -> _Slot:
        """Hold one in-flight slot (``with limiter.slot(c) as admitted``); ``admitted``
        is False (and nothing is held) when none is free. A class rather than a
        ``@contextmanager`` generator: this runs on every submission."""
        return _Slot(self.inflight, client, self.max_inflight)


class _Slot:
    __slots__ = ("_client", "_held", "_inflight", "_max")

    def __init__(self, inflight: Counter[str], client: str, max_inflight: int) -> None:
        self._inflight = inflight
        self._client = client
        self._max = max_inflight
        self._held = False

    def __enter__(self) -> bool:
        if self._inflight[self._client] >= self._max:
            return False
        self._inflight[self._client] += 1
        self._held = True
        return True

    def __exit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            self._inflight[self._client] -= 1
            if not self._inflight[self._client]:
                del self._inflight[self._client]
