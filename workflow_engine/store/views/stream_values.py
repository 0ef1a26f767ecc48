"""What readers of instances' output streams read (``GET /v1/jobs/{id}/stream``, the
describe's counts): a page of values after a seq, and where many instances stand.

A reader ends once its instance is final and it has every value: :func:`read_values`
reads the status *before* the values, in an earlier statement. An append needs the
lease, which the final write clears under the row lock, so every append of a final
instance committed before its final status did, and a later statement sees them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import TERMINAL_STATUSES, InstanceStatus


@dataclass(frozen=True, slots=True)
class StreamValue:
    seq: int
    stream: str
    #: The value as JSON text, as stored (sent as the SSE event's data unchanged).
    data: str


@dataclass(frozen=True, slots=True)
class StreamRead:
    """One page of an instance's values, and its status when the page was read."""

    status: InstanceStatus | None  # None: no instance with this id (yet)
    values: list[StreamValue]

    @property
    def final(self) -> bool:
        return self.status is not None and self.status in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class StreamState:
    """Where one instance stands, for a reader waiting on it."""

    status: InstanceStatus
    last_seq: int  # 0: nothing emitted yet


_STATUS = sa.text("SELECT status FROM onceflow_instances WHERE job_id = :j")
_VALUES = sa.text(
    "SELECT seq, stream, value::text FROM onceflow_stream_values"
    " WHERE job_id = :j AND seq > :after AND (CAST(:stream AS text) IS NULL OR stream = :stream)"
    " ORDER BY seq LIMIT :limit"
)


def read_values(
    db: Engine, job_id: str, after: int, stream: str | None = None, limit: int = 500
) -> StreamRead:
    """The values of ``job_id`` past seq ``after`` (of ``stream`` only, if given), at
    most ``limit``, with the instance's status read first (see the module's note)."""
    with db.connect() as conn:
        status = conn.execute(_STATUS, {"j": job_id}).scalar()
        conn.commit()  # the values in a later snapshot than the status
        if status is None:
            return StreamRead(None, [])
        rows = conn.execute(
            _VALUES, {"j": job_id, "after": after, "stream": stream, "limit": limit}
        ).all()
    return StreamRead(
        InstanceStatus(status), [StreamValue(int(s), name, data) for s, name, data in rows]
    )


_STATES = sa.text(
    "SELECT i.job_id, i.status, coalesce(s.last_seq, 0) FROM onceflow_instances i"
    " LEFT JOIN onceflow_streams s ON s.job_id = i.job_id"
    " WHERE i.job_id = ANY(CAST(:ids AS text[]))"
)


def stream_states(db: Engine, job_ids: Sequence[str]) -> dict[str, StreamState]:
    """Status and last seq of each of ``job_ids`` that has an instance: one statement
    for every open reader of an ingest process (its shared poll)."""
    if not job_ids:
        return {}
    with db.connect() as conn:
        rows = conn.execute(_STATES, {"ids": list(job_ids)}).all()
    return {job: StreamState(InstanceStatus(status), int(seq)) for job, status, seq in rows}


_COUNTS = sa.text(
    "SELECT stream, count(*) FROM onceflow_stream_values WHERE job_id = :j"
    " GROUP BY stream ORDER BY stream"
)


def stream_counts(conn: sa.Connection, job_id: str) -> dict[str, int]:
    """How many values each output stream of ``job_id`` holds (bounded per instance)."""
    return {stream: int(n) for stream, n in conn.execute(_COUNTS, {"j": job_id})}
