"""Time for timers (sleeps, retry delays, event timeouts), injectable for tests.

The system clock answers ``None``: SQL then uses the database's ``now()``, so every
timer compares against one time source whatever the engine hosts' clocks say. A
:class:`FakeClock` answers its own time, which tests move forward at will.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class SystemClock:
    def db_now(self) -> datetime | None:
        return None


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)

    def db_now(self) -> datetime | None:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
