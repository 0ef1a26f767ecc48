"""Live engines and the workflow versions each can run (``onceflow_engines``).

Every engine announces itself (``{workflow: version}``) every third of a lease and
removes its row on a clean stop; a row not refreshed for
:data:`~workflow_engine.store.instances.ENGINE_STALE_SECONDS` is an engine that died.
From it: which instances no live engine can run (a gauge, ``instances describe``).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import RUNNABLE_STATUSES
from workflow_engine.store.instances import ENGINE_HAS

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

_RUNNABLE = ", ".join(f"'{s}'" for s in sorted(RUNNABLE_STATUSES))
# "Runnable" is what the claim would take now: a runnable status *and* due. A sleeper
# whose timer is hours away, or an instance waiting for an event (run_after infinity),
# is not stuck yet; it is counted apart (``later``), since it will need the version too.
_WITHOUT_ENGINE = sa.text(
    f"""
SELECT i.workflow, i.version,
       count(*) FILTER (WHERE i.run_after <= now()),
       count(*) FILTER (WHERE i.run_after > now())
FROM onceflow_instances i
WHERE i.status IN ({_RUNNABLE})
  AND NOT EXISTS (
      SELECT 1 FROM onceflow_engines e
      WHERE e.last_seen_at > now() - make_interval(secs => :stale) AND {ENGINE_HAS})
GROUP BY 1, 2 ORDER BY 1, 2
"""
)


@dataclass(frozen=True, slots=True)
class LiveEngine:
    engine_id: str
    workflows: dict[str, str]
    last_seen_age_seconds: float


@dataclass(frozen=True, slots=True)
class Stranded:
    """Instances of one (workflow, version) that no live engine has: ``count`` are
    runnable now (due, so stuck until an engine with it runs); ``later`` sleep or wait
    and are not due yet (they will need it when they are)."""

    workflow: str
    version: str | None
    count: int
    later: int = 0


def announce(engine: Engine, engine_id: str, workflows: dict[str, str]) -> None:
    """Record (or refresh) this engine and the versions it has."""
    with engine.begin() as conn:
        conn.execute(_FORGET, {"forget": FORGET_AFTER_SECONDS})
        conn.execute(
            _ANNOUNCE, {"engine_id": engine_id, "workflows": orjson.dumps(workflows).decode()}
        )


def retire(engine: Engine, engine_id: str) -> None:
    """Remove this engine's row (clean shutdown)."""
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM onceflow_engines WHERE engine_id = :e"), {"e": engine_id})


def live_engines(engine: Engine, stale_seconds: float) -> list[LiveEngine]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT engine_id, workflows, extract(epoch FROM now() - last_seen_at)"
                " FROM onceflow_engines"
                " WHERE last_seen_at > now() - make_interval(secs => :stale)"
                " ORDER BY engine_id"
            ),
            {"stale": stale_seconds},
        )
        return [LiveEngine(e, dict(w), float(age)) for e, w, age in rows]


def instances_without_engine(engine: Engine, stale_seconds: float) -> list[Stranded]:
    """Instances per (workflow, version) that no live engine can run, runnable now or
    later (:class:`Stranded`)."""
    with engine.connect() as conn:
        rows = conn.execute(_WITHOUT_ENGINE, {"stale": stale_seconds})
        return [Stranded(w, v, due, later) for w, v, due, later in rows]
