"""The partition ranges every engine computes (no database)."""

from datetime import UTC, datetime, timedelta

from workflow_engine.store.writes import START_AHEAD, aligned, first_new_lower

DAY = timedelta(days=1)


def test_a_daily_range_starts_at_utc_midnight():
    at = datetime(2026, 11, 30, 7, 55, 12, tzinfo=UTC)
    assert aligned(at, DAY) == datetime(2026, 11, 30, tzinfo=UTC)
    assert aligned(datetime(2026, 11, 30, tzinfo=UTC), DAY) == datetime(2026, 11, 30, tzinfo=UTC)


def test_ranges_are_the_same_whatever_the_time_zone_of_now():
    utc = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
    elsewhere = utc.astimezone(datetime.now().astimezone().tzinfo)
    assert aligned(elsewhere, DAY) == aligned(utc, DAY) == datetime(2026, 11, 30, tzinfo=UTC)


def test_an_hourly_range():
    at = datetime(2026, 11, 30, 7, 55, tzinfo=UTC)
    assert aligned(at, timedelta(hours=1)) == datetime(2026, 11, 30, 7, tzinfo=UTC)


def test_the_next_partition_continues_from_the_newest_one_while_it_is_ahead():
    now = datetime(2026, 11, 30, 7, 55, tzinfo=UTC)
    ahead = datetime(2026, 12, 3, tzinfo=UTC)
    assert first_new_lower(ahead, now) == ahead
    assert first_new_lower(now + START_AHEAD, now) == now + START_AHEAD


def test_after_a_lapse_the_next_partition_starts_ahead_of_the_clock():
    """A range that has begun is being written: attaching it races the writers (23514),
    so the next partition starts past ``now + START_AHEAD``, on a whole minute."""
    now = datetime(2026, 11, 30, 7, 55, 12, 345, tzinfo=UTC)
    restart = datetime(2026, 11, 30, 8, 1, tzinfo=UTC)
    assert timedelta(minutes=5) == START_AHEAD
    for newest in (None, datetime(2026, 11, 29, tzinfo=UTC), now, now + timedelta(minutes=4)):
        assert first_new_lower(newest, now) == restart
    # ...and the range after it is back on the interval's bounds
    assert aligned(restart, DAY) + DAY == datetime(2026, 12, 1, tzinfo=UTC)
