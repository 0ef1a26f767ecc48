"""The partition ranges every engine computes (no database)."""

from datetime import UTC, datetime, timedelta

from workflow_engine.store.partitions import aligned

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
