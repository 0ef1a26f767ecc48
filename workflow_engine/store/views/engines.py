"""Live engines and the workflow versions each can run (``onceflow_engines``).

Every engine announces itself (``{workflow: version}``) every third of a lease and
removes its row on a clean stop; a row not refreshed for
:data:`ENGINE_STALE_SECONDS` is an engine that died.
From it: which instances no live engine can run (a gauge, ``instances describe``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from onceflow.vocabulary import RUNNABLE_STATUSES

#: How long an engine may go unseen before it counts as gone (its heartbeat runs every
#: third of a lease; the default lease is 30 s).
ENGINE_STALE_SECONDS = 60.0


#: Engine ``e`` can run instance ``i``: it has the instance's version of its workflow
#: (an instance without a version: any version of it).
ENGINE_HAS = (
    "(CASE WHEN i.version IS NULL THEN e.workflows ? i.workflow"
    " ELSE e.workflows ->> i.workflow = i.version END)"
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


_LIVE_ENGINES = sa.text(
    "SELECT engine_id, workflows, extract(epoch FROM now() - last_seen_at)"
    " FROM onceflow_engines"
    " WHERE last_seen_at > now() - make_interval(secs => :stale)"
    " ORDER BY engine_id"
)


def live_engines(db: Engine, stale_seconds: float) -> list[LiveEngine]:
    with db.connect() as conn:
        rows = conn.execute(_LIVE_ENGINES, {"stale": stale_seconds})
        return [LiveEngine(e, dict(w), float(age)) for e, w, age in rows]


def instances_without_engine(db: Engine, stale_seconds: float) -> list[Stranded]:
    """Instances per (workflow, version) that no live engine can run, runnable now or
    later (:class:`Stranded`)."""
    with db.connect() as conn:
        rows = conn.execute(_WITHOUT_ENGINE, {"stale": stale_seconds})
        return [Stranded(w, v, due, later) for w, v, due, later in rows]
