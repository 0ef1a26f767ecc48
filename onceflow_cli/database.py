"""The database a CLI command works on: a one-connection pool, for a short-lived process.

A module of its own so that the command modules (``main``, ``operator_log``,
``schedules``) reach it without importing one another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onceflow.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def connect(settings: Settings) -> Engine:
    from workflow_engine.store import make_engine  # imported when a command runs

    return make_engine(
        settings.database_url, pool_size=1, lifecycle_events=settings.lifecycle_events
    )
