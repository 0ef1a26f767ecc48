"""Time partitions of the history tables: created ahead, retired whole.

Migration 0012 range-partitions ``onceflow_step_attempts`` (on ``started_at``) and
``onceflow_duplicate_deliveries`` (on ``job_received_at``, the receive time of the job
id each row duplicates). Retention then drops a whole partition - no DELETE, no dead
tuples, no autovacuum debt - instead of deleting months of rows one by one.

The DDL runs inside two SECURITY DEFINER functions of the migration
(``onceflow_add_partition``, ``onceflow_retire_partition``) so the services' database
role, which cannot change the schema, can still maintain partitions; each call is its
own short transaction under ``lock_timeout`` so a busy table makes maintenance wait for
the next round, never the hot path. Whatever error a partition's creation or retirement
meets (a lock timeout, a deadlock, a cancelled statement, a row in the way) leaves that
partition for the next round and the round goes on; only a lost connection ends the
round, since the round's advisory lock went with it. Retiring holds nothing stronger
than ACCESS SHARE on the partition until its detach (migration 0013), so the engine's
checkpoints never wait on it. Two engines maintaining at once is harmless (the
functions skip a partition that exists or is gone) but :mod:`.maintenance` serialises
them anyway.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)

STEP_ATTEMPTS = "onceflow_step_attempts"
DUPLICATE_DELIVERIES = "onceflow_duplicate_deliveries"
#: The range-partitioned history tables, each with its ``<name>_default`` partition.
PARTITIONED_TABLES = (STEP_ATTEMPTS, DUPLICATE_DELIVERIES)
_KEY = {STEP_ATTEMPTS: "started_at", DUPLICATE_DELIVERIES: "job_received_at"}
# A row whose owner is gone: its step (attempts) or its job-id record (duplicates).
_ORPHAN = {
    STEP_ATTEMPTS: "NOT EXISTS (SELECT 1 FROM onceflow_steps s"
    " WHERE s.job_id = h.job_id AND s.position = h.position)",
    DUPLICATE_DELIVERIES: "NOT EXISTS (SELECT 1 FROM onceflow_jobs j WHERE j.job_id = h.job_id)",
}

# Maintenance waits at most this long for a table lock, then retries next round:
# attaching needs SHARE UPDATE EXCLUSIVE on the parent (and ACCESS EXCLUSIVE on its
# default partition, which it scans), detaching ACCESS EXCLUSIVE on the parent.
LOCK_TIMEOUT = "2s"
# A new partition starts at least this far ahead of the database's clock. Its range
# must hold no row, committed or in flight, until its ATTACH commits: the function
# moves the rows the default partition holds for the range, then the ATTACH scans the
# default partition again and fails (23514) on any row an engine committed in between.
# The keys are the writers' now() (step attempts' started_at, job ids' received_at),
# so no transaction can write into a range that starts after the clock; after a lapse
# the range being written stays in the default partition instead of being attached
# under load. Minutes cover the attach's lock waits (each at most LOCK_TIMEOUT) and its
# scan of a default partition that grew during the lapse.
START_AHEAD = timedelta(minutes=5)
# Why a partition was left for the next round (the log's reason), by SQLSTATE: the
# lock was not free in time, PostgreSQL broke a lock cycle by aborting this
# transaction, a row of the range reached the default partition while the attach
# waited, the statement was cancelled (statement_timeout, pg_cancel_backend); any
# other: "error". The DDL is retried as a whole.
_REASONS = {"55P03": "busy", "40P01": "deadlock", "23514": "rows_in_range", "57014": "cancelled"}
_BOUND_RE = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Partition:
    """One range partition: rows with ``lower <= key < upper``."""

    name: str
    lower: datetime
    upper: datetime


@dataclass(frozen=True, slots=True)
class Retired:
    """What retiring a table's expired partitions did."""

    dropped: tuple[str, ...] = ()
    kept_rows: int = 0  # rows of live history moved to the default partition
    skipped: int = 0  # partitions left for the next round (any error but a lost connection)


# The bounds pg_get_expr prints are in the session's zone: UTC, so they parse alike
# whatever the role's TimeZone.
_UTC = sa.text("SET LOCAL TimeZone = 'UTC'")
_BOUNDS = sa.text(
    "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)"
    " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = to_regclass(:parent)"
)


def partitions(conn: Connection, parent: str) -> list[Partition]:
    """The range partitions of ``parent``, oldest first (the default one excluded)."""
    conn.execute(_UTC)
    rows = conn.execute(_BOUNDS, {"parent": parent}).all()
    found = []
    for name, bound in rows:
        match = _BOUND_RE.search(bound or "")
        if match:  # the default partition's bound is "DEFAULT"
            lower, upper = (datetime.fromisoformat(b) for b in match.groups())
            found.append(Partition(name, lower, upper))
    return sorted(found, key=lambda p: p.lower)


def aligned(at: datetime, interval: timedelta) -> datetime:
    """``at`` rounded down to a multiple of ``interval`` since the epoch (UTC midnight
    for a daily interval), so every engine computes the same ranges."""
    return _EPOCH + ((at - _EPOCH) // interval) * interval


# SET LOCAL, with the timeout as a bind parameter (SET itself takes none), read per call
# so that a test can lengthen it (the interleaving tests, where a timeout is not what
# they exercise).
_SET_LOCK_TIMEOUT = sa.text("SELECT set_config('lock_timeout', :timeout, true)")
_ADD = sa.text("SELECT onceflow_add_partition(:parent, :lower, :upper)")


def add_partition(conn: Connection, parent: str, lower: datetime, upper: datetime) -> str | None:
    """Create and attach ``[lower, upper)``; rows of that range already in the default
    partition move into it. Returns its name, or None when it existed."""
    conn.execute(_SET_LOCK_TIMEOUT, {"timeout": LOCK_TIMEOUT})
    name: str | None = conn.execute(
        _ADD, {"parent": parent, "lower": lower, "upper": upper}
    ).scalar()
    return name


def first_new_lower(newest_upper: datetime | None, now: datetime) -> datetime:
    """Where a table's next partition starts: the newest one's upper bound (so ranges
    stay contiguous, and changing the interval never overlaps one), unless that is
    closer than :data:`START_AHEAD` to ``now`` (maintenance lapsed): then the first
    whole minute past ``now + START_AHEAD``, and the rows from before it stay in the
    default partition (it is never attached while it can still be written)."""
    earliest = now + START_AHEAD
    if newest_upper is not None and newest_upper >= earliest:
        return newest_upper
    return aligned(earliest, timedelta(minutes=1)) + timedelta(minutes=1)


def ensure_partitions(
    conn: Connection, now: datetime, interval: timedelta, ahead: int
) -> list[str]:
    """Make sure every partitioned table has partitions up to ``now + ahead * interval``.

    Ranges start at :func:`first_new_lower` and end on multiples of ``interval`` (a
    first range after a lapse is the rest of its interval). A range that cannot be
    created now (any error but a lost connection) stops that table for this round:
    the next round starts again from its newest partition, so no gap is left behind
    a range created later. Each partition is its own transaction (``conn`` must not
    be in one).
    """
    created: list[str] = []
    horizon = now + ahead * interval
    for parent in PARTITIONED_TABLES:
        with conn.begin():
            existing = partitions(conn, parent)
        start = first_new_lower(existing[-1].upper if existing else None, now)
        while start < horizon:
            upper = aligned(start, interval) + interval
            try:
                with conn.begin():
                    name = add_partition(conn, parent, start, upper)
            except sa.exc.DBAPIError as exc:
                _left_for_next_round("creation", parent, f"{start} - {upper}", exc)
                break
            if name:
                created.append(name)
                log.info(
                    "created partition %s",
                    name,
                    extra={"event": "store.partition_created", "table": parent},
                )
            start = upper
    return created


def _left_for_next_round(what: str, parent: str, target: str, exc: sa.exc.DBAPIError) -> None:
    """Log why a partition's ``what`` (creation, retirement) waits for the next round.

    Re-raises when the connection is gone (a failover, a restart): the round's
    session-level advisory lock went with it, so the round ends and the next one
    retries everything; any other error concerns this partition's statement only."""
    if exc.connection_invalidated:
        raise exc
    code = getattr(exc.orig, "pgcode", None) or ""
    reason = _REASONS.get(code, "error")
    log.warning(
        "partition %s left for the next round: %s %s (%s, SQLSTATE %s): %s",
        what,
        parent,
        target,
        reason,
        code or "none",
        (str(exc.orig).strip().splitlines() or [""])[0],  # the message, not its context
        extra={
            "event": "store.partition_postponed",
            "table": parent,
            "action": what,
            "reason": reason,
            "sqlstate": code,
        },
    )


_RETIRE = sa.text("SELECT onceflow_retire_partition(:name, :cutoff)")


def retire_expired(conn: Connection, parent: str, expired_before: datetime) -> Retired:
    """Drop every partition of ``parent`` whose whole range is before ``expired_before``.

    The rows in it that still belong to live history move to the default partition
    first (step attempts of an instance that has not finished before ``expired_before``;
    duplicate rows of a job id that still has an instance or task run): retention
    never removes the history of a live instance. Each partition is its own
    transaction (``conn`` must not be in one).
    """
    with conn.begin():
        expired = [p for p in partitions(conn, parent) if p.upper <= expired_before]
    dropped: list[str] = []
    kept = skipped = 0
    for partition in expired:
        try:
            with conn.begin():
                conn.execute(_SET_LOCK_TIMEOUT, {"timeout": LOCK_TIMEOUT})
                kept += conn.execute(
                    _RETIRE, {"name": partition.name, "cutoff": expired_before}
                ).scalar_one()
        except sa.exc.DBAPIError as exc:
            _left_for_next_round("retirement", parent, partition.name, exc)
            skipped += 1
            continue
        dropped.append(partition.name)
        log.info(
            "dropped partition %s",
            partition.name,
            extra={"event": "store.partition_dropped", "table": parent},
        )
    return Retired(tuple(dropped), kept, skipped)


def _delete_orphans_sql(parent: str, outside: list[str]) -> sa.TextClause:
    """The orphan delete on ``parent``'s default partition; built per call, since the
    table and the key ranges outside every partition vary."""
    # parent and key come from the constants above, never from input
    return sa.text(f"DELETE FROM {parent} h WHERE ({' OR '.join(outside)}) AND {_ORPHAN[parent]}")


def delete_orphans(conn: Connection, parent: str) -> int:
    """Delete the default partition's rows whose step (or job-id record) is gone.

    The partitioned tables have no foreign key to cascade through (migration 0012), and
    the rows a retired partition kept for a live instance stay in the default partition
    after that instance is deleted. The key condition is the complement of every range
    partition's range, so the planner scans the default partition alone (it is small:
    those kept rows, and rows written while no partition covered their time).
    """
    with conn.begin():
        ranges = partitions(conn, parent)
        key = _KEY[parent]
        outside, params = ["true"], {}
        if ranges:
            outside = [f"{key} < :b0", f"{key} >= :b{len(ranges)}"]
            params = {"b0": ranges[0].lower, f"b{len(ranges)}": ranges[-1].upper}
            for n, (a, b) in enumerate(itertools.pairwise(ranges), start=1):
                if a.upper < b.lower:  # a gap (maintenance was down): default holds it
                    outside.append(f"({key} >= :g{n}a AND {key} < :g{n}b)")
                    params.update({f"g{n}a": a.upper, f"g{n}b": b.lower})
        deleted: int = conn.execute(_delete_orphans_sql(parent, outside), params).rowcount
    return deleted
