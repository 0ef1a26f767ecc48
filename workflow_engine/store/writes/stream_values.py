"""Appends to instances' output streams (``ctx.emit``), batched with the checkpoints.

An :class:`~workflow_engine.store.commands.AppendValue` goes through the engine's
group-commit writer like a checkpoint (and may follow a held one in a ``Chain``), so an
emit is committed when it returns, for the price of a share in a batch's commit. One
statement appends the values of every instance in the batch:

* the lease is checked (``FOR SHARE`` of the instance row, the claim named): an older
  run, or an engine whose lease was taken over, appends nothing;
* a key already there (a replay emitting again) writes nothing and takes no seq;
* the seq comes from the instance's counter row (``onceflow_streams``), updated under
  its row lock until the commit, so seqs commit in order (migration 0018); the same
  update refuses a value past the instance's bounds;
* ``pg_notify`` on :data:`STREAM_CHANNEL` with the job id wakes the ingest processes'
  readers when the batch commits (one channel for everyone: ingest listens once per
  process, not once per job).
"""

from __future__ import annotations

import sqlalchemy as sa

from workflow_engine.errors import LeaseLost, StreamLimitReached
from workflow_engine.store.commands import Answer, Appended, AppendValue
from workflow_engine.store.fragments import held

#: The channel an append notifies (payload: the job id).
STREAM_CHANNEL = "onceflow_stream_values"

_APPEND = sa.text(
    f"""
WITH input AS (
    SELECT * FROM unnest(CAST(:job_ids AS text[]), CAST(:claims AS int[]),
                         CAST(:keys AS text[]), CAST(:streams AS text[]),
                         CAST(:payloads AS text[]), CAST(:sizes AS int[]),
                         CAST(:max_values AS int[]), CAST(:max_bytes AS bigint[]))
        AS t(job_id, claim, key, stream, payload, size, max_values, max_bytes)
),
lease AS (
    SELECT l.job_id FROM input CROSS JOIN LATERAL (
        SELECT i.job_id FROM onceflow_instances i
        WHERE i.job_id = input.job_id AND {held("i", "input.claim")}
        FOR SHARE OF i
    ) l
),
fresh AS (
    SELECT input.* FROM input JOIN lease USING (job_id)
    WHERE NOT EXISTS (SELECT 1 FROM onceflow_stream_values v
                      WHERE v.job_id = input.job_id AND v.key = input.key)
),
counted AS (
    INSERT INTO onceflow_streams AS s (job_id, last_seq, value_count, value_bytes)
    SELECT job_id, 1, 1, size FROM fresh WHERE size <= max_bytes
    ON CONFLICT ON CONSTRAINT onceflow_streams_pkey DO UPDATE
    SET last_seq = s.last_seq + 1, value_count = s.value_count + 1,
        value_bytes = s.value_bytes + excluded.value_bytes, updated_at = now()
    WHERE s.value_count < (SELECT f.max_values FROM fresh f WHERE f.job_id = s.job_id)
      AND s.value_bytes + excluded.value_bytes
          <= (SELECT f.max_bytes FROM fresh f WHERE f.job_id = s.job_id)
    RETURNING s.job_id, s.last_seq
),
appended AS (
    INSERT INTO onceflow_stream_values (job_id, seq, stream, key, value)
    SELECT f.job_id, c.last_seq, f.stream, f.key, CAST(f.payload AS jsonb)
    FROM fresh f JOIN counted c USING (job_id)
    ON CONFLICT ON CONSTRAINT onceflow_stream_values_key_key DO NOTHING
    RETURNING job_id, seq
),
notified AS (
    SELECT pg_notify(:channel, job_id) FROM appended
)
SELECT input.job_id, lease.job_id IS NOT NULL AS leased, fresh.job_id IS NOT NULL AS fresh,
       appended.seq, (SELECT count(*) FROM notified) AS notified
FROM input
LEFT JOIN lease USING (job_id)
LEFT JOIN fresh USING (job_id)
LEFT JOIN appended USING (job_id)
"""
)


def append_values(conn: sa.Connection, owner: str, writes: list[AppendValue]) -> list[Answer]:
    """Apply the appends of one batch (at most one per instance: the writer's rule)."""
    rows = conn.execute(
        _APPEND,
        {
            "owner": owner,
            "channel": STREAM_CHANNEL,
            "job_ids": [w.job_id for w in writes],
            "claims": [w.claim for w in writes],
            "keys": [w.key for w in writes],
            "streams": [w.stream for w in writes],
            "payloads": [w.value.decode() for w in writes],
            "sizes": [len(w.value) for w in writes],
            "max_values": [w.max_values for w in writes],
            "max_bytes": [w.max_bytes for w in writes],
        },
    ).all()
    found = {row.job_id: row for row in rows}
    return [_answer(w, found[w.job_id]) for w in writes]


def _answer(w: AppendValue, row: sa.Row) -> Answer:
    if not row.leased:
        return LeaseLost(f"lease on {w.job_id} lost before emitting to stream {w.stream!r}")
    if not row.fresh:
        return Appended(None)  # emitted before this replay: collapsed
    if row.seq is None:
        return StreamLimitReached(
            f"emit to stream {w.stream!r} refused: the instance's output streams are at"
            f" their bound (ONCEFLOW_STREAM_MAX_VALUES={w.max_values} values,"
            f" ONCEFLOW_STREAM_MAX_BYTES={w.max_bytes} bytes in all; this value is"
            f" {len(w.value)} bytes); nothing was written"
        )
    return Appended(int(row.seq))


_FORGET_VALUES = sa.text("DELETE FROM onceflow_stream_values WHERE job_id = :j")
_RESET_COUNTS = sa.text(
    "UPDATE onceflow_streams SET value_count = 0, value_bytes = 0, updated_at = now()"
    " WHERE job_id = :j"
)


def forget_values(conn: sa.Connection, job_id: str) -> None:
    """A restart: the values go with the history; the counter keeps its last seq, so
    the restarted run's values come after every seq a reader has seen."""
    conn.execute(_FORGET_VALUES, {"j": job_id})
    conn.execute(_RESET_COUNTS, {"j": job_id})
