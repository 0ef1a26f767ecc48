"""When a schedule ticks, which job id a tick gets, and what a due schedule does.

Pure functions (no database, no clock of their own), so the engine's scheduler, the
CLI's backfill dry run and the admin API compute the very same ticks, and unit tests
pin them down.

* A spec is a 5-field cron expression in a time zone (croniter reads the expression;
  zoneinfo maps local wall-clock times to instants) or a fixed interval in whole
  seconds (``every``), aligned to the Unix epoch so every engine agrees on the ticks.
* Cron times are local wall-clock times. A local time that does not exist (the hour
  skipped when DST starts) maps with the offset in force before the jump, so a daily
  ``30 2 * * *`` in ``America/New_York`` runs at 03:30 EDT that day; ticks that land on
  the same instant are one tick. A local time that occurs twice (the hour repeated when
  DST ends) runs once, at its first occurrence. Use ``UTC`` for interval-like crons.
* A tick's job id is ``<schedule>@<UTC instant>`` (``nightly@2026-11-30T10:05:00Z``):
  ``@`` and ``:`` are not allowed in a submitted job id, so no HTTP job can take it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from onceflow.errors import OnceflowError
from onceflow.vocabulary import CatchupPolicy, OverlapPolicy, TickSkipReason, TickTrigger

SCHEDULE_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$"
_NAME_RE = re.compile(SCHEDULE_NAME_PATTERN)
#: Counting missed ticks stops here (a cron that missed weeks of minutes): the
#: ``ticks skipped`` figures are then a lower bound.
COUNT_CAP = 10_000
#: How late a tick may fire and still count as on time (not missed).
DEFAULT_GRACE_SECONDS = 60.0
#: The longest interval (a leap year); longer periods are crons.
MAX_EVERY_SECONDS = 366 * 86400


class InvalidSchedule(OnceflowError):
    """A schedule's spec, name or policy is not acceptable."""


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise InvalidSchedule(
            f"schedule name {name!r}: 1-80 letters, digits, '_', '.' or '-'"
            " (not starting with '.' or '-')"
        )
    return name


def tick_job_id(schedule: str, tick: datetime) -> str:
    """The job id of one tick: the same on every engine, after any restart."""
    return f"{schedule}@{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise InvalidSchedule("times must carry a time zone")
    return moment.astimezone(UTC)


@dataclass(frozen=True)
class TickSpec:
    """When a schedule ticks: ``cron`` (5 fields, in ``timezone``) or ``every_seconds``."""

    cron: str | None = None
    every_seconds: int | None = None
    timezone: str = "UTC"
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_seconds is None):
            raise InvalidSchedule("a schedule needs exactly one of cron or every")
        if self.cron is not None:
            if len(self.cron.split()) != 5 or not croniter.is_valid(self.cron):
                raise InvalidSchedule(
                    f"cron {self.cron!r}: expected 5 fields (minute hour day month weekday)"
                )
        elif self.every_seconds is None or not 1 <= self.every_seconds <= MAX_EVERY_SECONDS:
            raise InvalidSchedule(f"every must be from 1 to {MAX_EVERY_SECONDS} seconds")
        try:
            if len(self.timezone) > 64:
                raise ValueError("too long")
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise InvalidSchedule(f"unknown time zone {self.timezone[:64]!r}") from None
        object.__setattr__(self, "_zone", zone)
        if self.cron is not None:
            try:  # "0 0 30 2 *" parses, and never fires
                self.next_after(datetime(2000, 1, 1, tzinfo=UTC))
            except CroniterBadDateError:
                raise InvalidSchedule(f"cron {self.cron!r} never fires") from None

    @classmethod
    def of(cls, schedule: str | timedelta, timezone: str = "UTC") -> TickSpec:
        """From ``@workflow(schedule=...)``: a cron string or a ``timedelta``."""
        if isinstance(schedule, timedelta):
            seconds = schedule.total_seconds()
            if seconds != int(seconds):
                raise InvalidSchedule("every must be a whole number of seconds")
            return cls(every_seconds=int(seconds), timezone=timezone)
        return cls(cron=schedule, timezone=timezone)

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.timezone})"
        return f"every {self.every_seconds}s"

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (UTC)."""
        return next(self._walk(moment))

    def _walk(self, moment: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``moment``, ascending, without end."""
        moment = _utc(moment)
        if self.every_seconds is not None:
            step = self.every_seconds
            epoch = int(moment.timestamp() // step) * step
            while True:
                epoch += step
                yield datetime.fromtimestamp(epoch, UTC)
        assert self.cron is not None
        # One iterator over local wall-clock times (croniter on naive datetimes knows
        # no DST), each mapped to its instant; the map is not monotonic around DST
        # changes, so instants at or before the last one are dropped.
        it = croniter(self.cron, moment.astimezone(self._zone).replace(tzinfo=None))
        last = moment
        while True:
            naive = it.get_next(datetime)
            tick = naive.replace(tzinfo=self._zone, fold=0).astimezone(UTC)
            if tick > last:
                last = tick
                yield tick

    def iter_between(self, start: datetime, end: datetime, cap: int = COUNT_CAP) -> list[datetime]:
        """Ticks in ``[start, end]``, ascending, at most ``cap`` of them (the first)."""
        end = _utc(end)
        ticks: list[datetime] = []
        for tick in self._walk(_utc(start) - timedelta(microseconds=1)):
            if tick > end or len(ticks) >= cap:
                break
            ticks.append(tick)
        return ticks

    def latest_between(self, start: datetime, end: datetime, n: int) -> tuple[list[datetime], int]:
        """The latest ``n`` ticks in ``[start, end]`` (ascending) and how many there are
        in all, counted up to :data:`COUNT_CAP` (past it, the ``n`` are the ticks just
        before ``end`` and the count is a lower bound)."""
        start, end = _utc(start), _utc(end)
        if self.every_seconds is not None:
            step = self.every_seconds
            first = int(start.timestamp() // step) * step
            first += 0 if first >= start.timestamp() else step
            last = int(end.timestamp() // step) * step
            total = 0 if last < first else (last - first) // step + 1
            keep = min(n, total)
            return [datetime.fromtimestamp(last - step * k, UTC) for k in range(keep)][::-1], total
        ticks = self.iter_between(start, end, COUNT_CAP)
        if len(ticks) == COUNT_CAP and self.next_after(ticks[-1]) <= end:
            # More are due than counted: the newest, found walking back from ``end``.
            return self._latest_walking_back(start, end, n), COUNT_CAP
        return ticks[-n:] if n else [], len(ticks)

    def _latest_walking_back(self, start: datetime, end: datetime, n: int) -> list[datetime]:
        assert self.cron is not None
        it = croniter(
            self.cron, (end + timedelta(seconds=1)).astimezone(self._zone).replace(tzinfo=None)
        )
        found: set[datetime] = set()
        while len(found) < n:
            naive = it.get_prev(datetime)
            tick = naive.replace(tzinfo=self._zone, fold=0).astimezone(UTC)
            if tick < start:
                break
            if tick <= end:
                found.add(tick)
        return sorted(found)


@dataclass(frozen=True)
class DueSchedule:
    """What :func:`plan` needs to know about one due schedule."""

    spec: TickSpec
    catchup: CatchupPolicy
    overlap: OverlapPolicy
    max_catchup: int
    next_fire_at: datetime
    buffered_tick_at: datetime | None
    previous_running: bool  # the last fired tick's instance has not finished


@dataclass(frozen=True)
class PlannedTick:
    tick_at: datetime
    trigger: TickTrigger


@dataclass(frozen=True)
class TickPlan:
    """What a due schedule does now: the ticks to fire, what it skips, the new state."""

    fire: tuple[PlannedTick, ...]
    skipped: dict[TickSkipReason, int]
    buffered_tick_at: datetime | None
    next_fire_at: datetime


def plan(s: DueSchedule, now: datetime, grace_seconds: float = DEFAULT_GRACE_SECONDS) -> TickPlan:
    """Decide one schedule's ticks at ``now``.

    Due ticks are those in ``[next_fire_at, now]``. The latest of them is *on time*
    when it is at most ``grace_seconds`` late; every other due tick was missed. The
    catch-up policy picks which to run: ``skip`` only an on-time tick, ``run-once`` the
    latest, ``run-all`` the latest ``max_catchup``. Then the overlap policy, tick by
    tick, while the previous tick's instance (or one just fired) has not finished:
    ``skip`` drops the tick, ``allow`` fires it, ``buffer-one`` keeps the first such
    tick and fires it once the previous instance finished (later ones are dropped).
    """
    fire: list[PlannedTick] = []
    skipped = {TickSkipReason.CATCHUP: 0, TickSkipReason.OVERLAP: 0}
    running, buffered = s.previous_running, s.buffered_tick_at
    if buffered is not None and not running:
        fire.append(PlannedTick(buffered, TickTrigger.BUFFERED))
        running, buffered = True, None
    if s.next_fire_at > now:
        return TickPlan(tuple(fire), skipped, buffered, s.next_fire_at)
    keep = s.max_catchup if s.catchup == CatchupPolicy.RUN_ALL else 1
    latest, total = s.spec.latest_between(s.next_fire_at, now, keep)
    on_time = bool(latest) and (now - latest[-1]).total_seconds() <= grace_seconds
    if s.catchup == CatchupPolicy.SKIP and not on_time:
        latest = []
    skipped[TickSkipReason.CATCHUP] = total - len(latest)
    for tick in latest:
        late = tick != latest[-1] or not on_time
        trigger = TickTrigger.CATCH_UP if late else TickTrigger.ON_TIME
        if running and s.overlap == OverlapPolicy.SKIP:
            skipped[TickSkipReason.OVERLAP] += 1
        elif running and s.overlap == OverlapPolicy.BUFFER_ONE:
            if buffered is None:
                buffered = tick
            else:
                skipped[TickSkipReason.OVERLAP] += 1
        else:
            fire.append(PlannedTick(tick, trigger))
            running = True
    return TickPlan(tuple(fire), skipped, buffered, s.spec.next_after(now))


@dataclass(frozen=True)
class BackfillRange:
    """The ticks of ``[start, end]``: how many, the first and the last."""

    ticks: tuple[datetime, ...]
    total: int

    @property
    def first(self) -> datetime | None:
        return self.ticks[0] if self.ticks else None

    @property
    def last(self) -> datetime | None:
        return self.ticks[-1] if self.ticks else None


def backfill_range(spec: TickSpec, start: datetime, end: datetime, limit: int) -> BackfillRange:
    """The ticks a backfill of ``[start, end]`` creates; refuses more than ``limit``."""
    if _utc(end) < _utc(start):
        raise InvalidSchedule("the backfill range ends before it starts")
    try:
        ticks = spec.iter_between(start, end, cap=limit + 1)
    except (OverflowError, ValueError, CroniterBadDateError):  # near year 1 or 9999
        raise InvalidSchedule("the backfill range is out of bounds") from None
    if len(ticks) > limit:
        raise InvalidSchedule(f"the range holds more than {limit} ticks: backfill a shorter range")
    return BackfillRange(tuple(ticks), len(ticks))


@dataclass(frozen=True)
class Schedule:
    """A schedule declared on a workflow, with its policies:
    ``@workflow("report", schedule=Schedule("0 6 * * *", "Europe/Paris", overlap=...))``.
    A plain ``schedule="*/5 * * * *"`` (or a ``timedelta``) takes the defaults."""

    every: str | timedelta  # a 5-field cron expression, or an interval
    timezone: str = "UTC"
    catchup: CatchupPolicy = CatchupPolicy.RUN_ONCE
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    params: Mapping[str, Any] = field(default_factory=dict)
    max_catchup: int = 100
    name: str | None = None  # default: the workflow's name

    @property
    def spec(self) -> TickSpec:
        return TickSpec.of(self.every, self.timezone)
