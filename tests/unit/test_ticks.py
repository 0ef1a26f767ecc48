"""Tick computation and the catch-up / overlap plan of a due schedule (no services)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from onceflow.ticks import (
    COUNT_CAP,
    DueSchedule,
    InvalidSchedule,
    TickSpec,
    backfill_range,
    check_name,
    plan,
    tick_job_id,
)
from onceflow.vocabulary import CatchupPolicy, OverlapPolicy, TickSkipReason, TickTrigger

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def test_job_id_is_the_schedule_and_the_utc_instant():
    tick = datetime(2026, 11, 30, 11, 5, tzinfo=UTC).astimezone(ZoneInfo("Europe/Paris"))
    assert tick_job_id("nightly", tick) == "nightly@2026-11-30T11:05:00Z"


def test_cron_ticks_in_utc():
    spec = TickSpec(cron="*/5 * * * *")
    assert spec.next_after(T0) == T0 + timedelta(minutes=5)
    assert spec.next_after(T0 - timedelta(seconds=1)) == T0
    assert spec.iter_between(T0, T0 + timedelta(minutes=12)) == [
        T0,
        T0 + timedelta(minutes=5),
        T0 + timedelta(minutes=10),
    ]


def test_every_ticks_are_aligned_to_the_epoch():
    spec = TickSpec(every_seconds=7)
    start = datetime.fromtimestamp(7 * 1000 + 3, UTC)
    assert spec.next_after(start) == datetime.fromtimestamp(7 * 1001, UTC)
    latest, total = spec.latest_between(start, start + timedelta(seconds=30), 2)
    assert total == 4
    assert [t.timestamp() for t in latest] == [7 * 1003, 7 * 1004]


def test_dst_spring_forward_runs_a_skipped_local_time_one_hour_later():
    spec = TickSpec(cron="30 2 * * *", timezone="America/New_York")
    # 2026-03-08 02:30 does not exist in New York: the tick is 03:30 EDT (07:30 UTC).
    tick = spec.next_after(datetime(2026, 3, 7, 12, tzinfo=UTC))
    assert tick == datetime(2026, 3, 8, 7, 30, tzinfo=UTC)
    assert spec.next_after(tick) == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)


def test_dst_fall_back_runs_a_repeated_local_time_once():
    spec = TickSpec(cron="30 1 * * *", timezone="America/New_York")
    ticks = spec.iter_between(
        datetime(2026, 10, 31, 12, tzinfo=UTC), datetime(2026, 11, 2, 0, tzinfo=UTC)
    )
    # 01:30 happens twice on 2026-11-01 (EDT, then EST): one tick, the first.
    assert ticks == [datetime(2026, 11, 1, 5, 30, tzinfo=UTC)]


def test_many_missed_ticks_are_counted_to_the_cap_and_the_latest_found():
    spec = TickSpec(cron="* * * * *")
    end = T0 + timedelta(days=30)
    latest, total = spec.latest_between(T0, end, 2)
    assert total == COUNT_CAP
    assert latest == [end - timedelta(minutes=1), end]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cron": "* * * *"},
        {"cron": "* * * * * *"},
        {"cron": "61 * * * *"},
        {"every_seconds": 0},
        {"cron": "* * * * *", "every_seconds": 5},
        {},
        {"cron": "* * * * *", "timezone": "Mars/Olympus"},
        {"cron": "* * * * *", "timezone": "x" * 5000},
        {"cron": "0 0 30 2 *"},  # parses, never fires
        {"every_seconds": 10**12},
    ],
)
def test_invalid_specs_are_refused(kwargs):
    with pytest.raises(InvalidSchedule):
        TickSpec(**kwargs)


def test_names_cannot_make_odd_job_ids():
    assert check_name("nightly-report.v2") == "nightly-report.v2"
    for bad in ("", "-x", "a b", "a@b", "x" * 81):
        with pytest.raises(InvalidSchedule):
            check_name(bad)


def _due(catchup, overlap=OverlapPolicy.ALLOW, running=False, buffered=None, max_catchup=100):
    return DueSchedule(
        TickSpec(cron="*/5 * * * *"),
        catchup,
        overlap,
        max_catchup,
        T0,
        buffered,
        running,
    )


def test_on_time_tick_fires_under_every_catchup_policy():
    for policy in CatchupPolicy:
        p = plan(_due(policy), T0 + timedelta(seconds=1))
        assert [(t.tick_at, t.trigger) for t in p.fire] == [(T0, TickTrigger.ON_TIME)]
        assert p.next_fire_at == T0 + timedelta(minutes=5)


def test_catchup_after_an_hour_down():
    now = T0 + timedelta(hours=1, seconds=90)  # 13 ticks due, the latest 90 s late
    skip = plan(_due(CatchupPolicy.SKIP), now)
    assert skip.fire == () and skip.skipped[TickSkipReason.CATCHUP] == 13
    once = plan(_due(CatchupPolicy.RUN_ONCE), now)
    assert [t.tick_at for t in once.fire] == [T0 + timedelta(hours=1)]
    assert once.fire[0].trigger == TickTrigger.CATCH_UP
    assert once.skipped[TickSkipReason.CATCHUP] == 12
    everything = plan(_due(CatchupPolicy.RUN_ALL, max_catchup=5), now)
    assert [t.tick_at for t in everything.fire] == [
        T0 + timedelta(minutes=m) for m in (40, 45, 50, 55, 60)
    ]
    assert everything.skipped[TickSkipReason.CATCHUP] == 8
    assert everything.next_fire_at == T0 + timedelta(hours=1, minutes=5)


def test_overlap_policies_while_the_previous_instance_runs():
    now = T0 + timedelta(seconds=1)
    skip = plan(_due(CatchupPolicy.RUN_ONCE, OverlapPolicy.SKIP, running=True), now)
    assert skip.fire == () and skip.skipped[TickSkipReason.OVERLAP] == 1
    allow = plan(_due(CatchupPolicy.RUN_ONCE, OverlapPolicy.ALLOW, running=True), now)
    assert len(allow.fire) == 1
    buffer = plan(_due(CatchupPolicy.RUN_ONCE, OverlapPolicy.BUFFER_ONE, running=True), now)
    assert buffer.fire == () and buffer.buffered_tick_at == T0
    # A second tick while one is buffered is dropped; the buffered one waits.
    full = plan(
        _due(CatchupPolicy.RUN_ONCE, OverlapPolicy.BUFFER_ONE, running=True, buffered=T0), now
    )
    assert full.buffered_tick_at == T0 and full.skipped[TickSkipReason.OVERLAP] == 1


def test_the_buffered_tick_fires_once_the_previous_finished():
    due = DueSchedule(
        TickSpec(cron="*/5 * * * *"),
        CatchupPolicy.RUN_ONCE,
        OverlapPolicy.BUFFER_ONE,
        100,
        T0 + timedelta(minutes=5),
        T0,
        False,
    )
    p = plan(due, T0 + timedelta(minutes=2))
    assert [(t.tick_at, t.trigger) for t in p.fire] == [(T0, TickTrigger.BUFFERED)]
    assert p.buffered_tick_at is None


def test_backfill_range_counts_what_it_creates_and_is_bounded():
    spec = TickSpec(cron="0 * * * *")
    r = backfill_range(spec, T0, T0 + timedelta(hours=5), limit=100)
    assert r.total == 6 and r.first == T0 and r.last == T0 + timedelta(hours=5)
    with pytest.raises(InvalidSchedule):
        backfill_range(spec, T0, T0 + timedelta(days=30), limit=100)
    with pytest.raises(InvalidSchedule):
        backfill_range(spec, T0, T0 - timedelta(hours=1), limit=100)
    with pytest.raises(InvalidSchedule):
        backfill_range(spec, datetime.max.replace(tzinfo=UTC) - timedelta(hours=3),
                       datetime.max.replace(tzinfo=UTC), limit=100)  # fmt: skip
