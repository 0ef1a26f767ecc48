"""``ctx.set_attributes``: an instance's searchable attributes updated from workflow code.

The rule (docs/architecture.md, "Searchable attributes"): an update is an entry of its
own in the history (kind ``attributes``, at the position the code reached, its result
the update as given), inserted in the same transaction as the instance's new
attributes, under the row lock and the lease. So the change and its record commit
together or not at all: a crash before the commit loses both (the replay makes the
update again, once), a crash after keeps both (the replay finds the entry and applies
nothing). The merge happens here, on the row read under the lock, and the bounds
(:func:`onceflow.envelope.check_attributes`) are checked on the merged result: an
update that would not fit writes nothing and raises :class:`InvalidAttributes`.
"""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from onceflow.envelope import merge_attributes
from onceflow.vocabulary import StepKind, StepStatus
from workflow_engine.errors import (
    ControlRequested,
    InvalidAttributes,
    LeaseLost,
    NonDeterminismError,
)
from workflow_engine.store.commands import Lease
from workflow_engine.store.db import constraint_of
from workflow_engine.store.fragments import held

_LOCKED = sa.text(
    f"""
SELECT attributes, requested_action FROM onceflow_instances
WHERE job_id = :job_id AND {held()}
FOR UPDATE
"""
)

_APPLY = sa.text(
    f"""
WITH entry AS (
    INSERT INTO onceflow_steps AS s (job_id, position, name, kind, status, attempts,
                                     result, finished_at)
    VALUES (:job_id, :position, :name, '{StepKind.ATTRIBUTES}', '{StepStatus.COMPLETE}', 0,
            CAST(:update AS jsonb), now())
    ON CONFLICT ON CONSTRAINT onceflow_steps_pkey DO NOTHING
    RETURNING s.position
)
UPDATE onceflow_instances SET attributes = CAST(:merged AS jsonb)
WHERE job_id = :job_id AND EXISTS (SELECT 1 FROM entry)
"""
)


def set_attributes(
    db: Engine, lease: Lease, job_id: str, position: int, name: str, update: dict[str, Any]
) -> dict[str, Any]:
    """Merge ``update`` into the instance's attributes (a None value removes its key)
    and record it at ``position``, in one transaction; return the attributes now.
    LeaseLost, ControlRequested, InvalidAttributes (nothing written), or
    NonDeterminismError when another entry holds the position or the name."""
    try:
        with db.begin() as conn:
            row = conn.execute(_LOCKED, {**lease._asdict(), "job_id": job_id}).one_or_none()
            if row is None:
                raise LeaseLost(f"lease on {job_id} lost before set_attributes")
            if row.requested_action is not None:
                raise ControlRequested(row.requested_action)
            try:
                merged = merge_attributes(row.attributes, update)
            except ValueError as exc:
                raise InvalidAttributes(f"ctx.set_attributes refused: {exc}") from None
            params = {
                "job_id": job_id,
                "position": position,
                "name": name,
                "update": orjson.dumps(update).decode(),
                "merged": orjson.dumps(merged).decode(),
            }
            if conn.execute(_APPLY, params).rowcount != 1:
                raise NonDeterminismError(
                    f"set_attributes at position {position}: another entry is recorded there"
                )
    except IntegrityError as exc:
        if constraint_of(exc) == "onceflow_steps_name_key":
            raise NonDeterminismError(f"entry name {name!r} is also used as a step name") from None
        raise
    return merged
