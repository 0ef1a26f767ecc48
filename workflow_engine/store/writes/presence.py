"""An engine's presence in ``onceflow_engines``: announced (with the workflow versions
it has) every third of a lease, removed on a clean stop. What is read of it (live
engines, instances no live engine can run) is :mod:`workflow_engine.store.views.engines`."""

from __future__ import annotations

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine

#: Rows of engines gone this long are deleted by the next announcement.
FORGET_AFTER_SECONDS = 24 * 3600.0


_ANNOUNCE = sa.text(
    """
INSERT INTO onceflow_engines AS e (engine_id, workflows)
VALUES (:engine_id, CAST(:workflows AS jsonb))
ON CONFLICT ON CONSTRAINT onceflow_engines_pkey
    DO UPDATE SET workflows = EXCLUDED.workflows, last_seen_at = now()
"""
)


_FORGET = sa.text(
    "DELETE FROM onceflow_engines WHERE last_seen_at < now() - make_interval(secs => :forget)"
)


def announce(db: Engine, engine_id: str, workflows: dict[str, str]) -> None:
    """Record (or refresh) this engine and the versions it has."""
    with db.begin() as conn:
        conn.execute(_FORGET, {"forget": FORGET_AFTER_SECONDS})
        conn.execute(
            _ANNOUNCE, {"engine_id": engine_id, "workflows": orjson.dumps(workflows).decode()}
        )


_RETIRE = sa.text("DELETE FROM onceflow_engines WHERE engine_id = :e")


def retire(db: Engine, engine_id: str) -> None:
    """Remove this engine's row (clean shutdown)."""
    with db.begin() as conn:
        conn.execute(_RETIRE, {"e": engine_id})
