"""Dead-lettered source records, kept in the database (``onceflow_dead_letters``).

The streams worker sends a record it cannot use (unparseable, unknown type, too large,
a task that failed for good …) to the dead-letter topic, and records it here in the
same breath, one row per *source* Kafka position. So the system can answer, by job id
or by position: "this was dead-lettered, this is why, this is where it went" - for
``GET /v1/jobs/{id}``, ``job_trace``, ``instances describe`` and the audit, which would
otherwise wait forever for an instance that will never exist.

``record_dead_letters`` is idempotent per source position (the named unique
constraint ``onceflow_dead_letters_source_key``): a record dead-lettered again after a
redelivery never counts twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from onceflow.vocabulary import DeadLetterReason


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """One dead-lettered source record, as the worker writes it."""

    source_topic: str
    source_partition: int
    source_offset: int
    job_id: str | None  # when the key or the body named one
    reason: DeadLetterReason
    detail: str  # the human text (the code is ``reason``)
    original_size: int  # bytes of the source record's value
    sha256: str  # of the source record's value (hex)
    truncated: bool  # the DLQ copy holds only a bounded prefix
    dlq_topic: str
    dlq_partition: int | None = None  # None when the DLQ write's position is unknown
    dlq_offset: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeadLetterView(DeadLetterRow):
    """A stored dead letter, with when it was recorded."""

    created_at: datetime | None = None

    @property
    def source(self) -> str:
        return f"{self.source_topic}/{self.source_partition}@{self.source_offset}"

    @property
    def dlq(self) -> str:
        if self.dlq_partition is None or self.dlq_offset is None:
            return self.dlq_topic
        return f"{self.dlq_topic}/{self.dlq_partition}@{self.dlq_offset}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "reason": str(self.reason),
            "detail": self.detail,
            "source_topic": self.source_topic,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "dlq_topic": self.dlq_topic,
            "dlq_partition": self.dlq_partition,
            "dlq_offset": self.dlq_offset,
            "original_size": self.original_size,
            "sha256": self.sha256,
            "truncated": self.truncated,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


_RECORD_SQL = sa.text(
    """
INSERT INTO onceflow_dead_letters (
    source_topic, source_partition, source_offset, job_id, reason, detail,
    original_size, sha256, truncated, dlq_topic, dlq_partition, dlq_offset, headers)
SELECT r.source_topic, r.source_partition, r.source_offset, r.job_id, r.reason, r.detail,
       r.original_size, r.sha256, r.truncated, r.dlq_topic, r.dlq_partition, r.dlq_offset,
       coalesce(r.headers, '{}'::jsonb)
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
    source_topic text, source_partition integer, source_offset bigint, job_id text,
    reason text, detail text, original_size integer, sha256 text, truncated boolean,
    dlq_topic text, dlq_partition integer, dlq_offset bigint, headers jsonb)
ORDER BY r.source_topic, r.source_partition, r.source_offset
ON CONFLICT ON CONSTRAINT onceflow_dead_letters_source_key DO NOTHING
"""
)


def _as_json(row: DeadLetterRow) -> dict[str, Any]:
    return {
        "source_topic": row.source_topic,
        "source_partition": row.source_partition,
        "source_offset": row.source_offset,
        "job_id": row.job_id,
        "reason": str(DeadLetterReason(row.reason)),
        "detail": row.detail,
        "original_size": row.original_size,
        "sha256": row.sha256,
        "truncated": row.truncated,
        "dlq_topic": row.dlq_topic,
        "dlq_partition": row.dlq_partition,
        "dlq_offset": row.dlq_offset,
        "headers": dict(row.headers),
    }


def record_dead_letters_in(conn: Connection, rows: Sequence[DeadLetterRow]) -> int:
    """Record dead letters inside the caller's transaction; return how many were new."""
    if not rows:
        return 0
    payload = orjson.dumps([_as_json(r) for r in rows]).decode()
    return conn.execute(_RECORD_SQL, {"rows": payload}).rowcount or 0


def record_dead_letters(db: Engine, rows: Sequence[DeadLetterRow]) -> int:
    """Record a batch of dead letters in one statement; return how many were new.

    A source position already recorded is skipped (a redelivered record dead-lettered
    again), so the count is of rows added now.
    """
    if not rows:
        return 0
    with db.begin() as conn:
        return record_dead_letters_in(conn, rows)


_COLUMNS = (
    "source_topic, source_partition, source_offset, job_id, reason, detail, original_size,"
    " sha256, truncated, dlq_topic, dlq_partition, dlq_offset, headers, created_at"
)


def _view(r: Any) -> DeadLetterView:
    return DeadLetterView(
        source_topic=r.source_topic,
        source_partition=r.source_partition,
        source_offset=r.source_offset,
        job_id=r.job_id,
        reason=DeadLetterReason(r.reason),
        detail=r.detail,
        original_size=r.original_size,
        sha256=r.sha256,
        truncated=r.truncated,
        dlq_topic=r.dlq_topic,
        dlq_partition=r.dlq_partition,
        dlq_offset=r.dlq_offset,
        headers=dict(r.headers or {}),
        created_at=r.created_at,
    )


_FOR_JOB = sa.text(
    f"SELECT {_COLUMNS} FROM onceflow_dead_letters WHERE job_id = :j"
    " ORDER BY created_at, source_topic, source_partition, source_offset"
)


def dead_letters_for(db: Engine, job_id: str) -> list[DeadLetterView]:
    """Every dead-lettered record that named ``job_id``, oldest first."""
    with db.connect() as conn:
        rows = conn.execute(_FOR_JOB, {"j": job_id})
        return [_view(r) for r in rows]


_COUNTS = sa.text("SELECT reason, count(*) FROM onceflow_dead_letters GROUP BY reason")


def dead_letter_counts(db: Engine) -> dict[DeadLetterReason, int]:
    """How many source records were dead-lettered, by reason (reasons with none omitted)."""
    with db.connect() as conn:
        rows = conn.execute(_COUNTS)
        return {DeadLetterReason(reason): int(n) for reason, n in rows}


# The position spelled as the ``onceflow-dlq-source`` header spells it.
_SOURCES = sa.text(
    "SELECT source_topic || '/' || source_partition || '@' || source_offset,"
    " reason FROM onceflow_dead_letters"
)


def dead_letter_sources(db: Engine) -> dict[str, DeadLetterReason]:
    """Every dead-lettered source position (``topic/partition@offset``, the form of the
    ``onceflow-dlq-source`` header) with its reason: what the audit counts as consumed."""
    with db.connect() as conn:
        rows = conn.execute(_SOURCES)
        return {source: DeadLetterReason(reason) for source, reason in rows}
