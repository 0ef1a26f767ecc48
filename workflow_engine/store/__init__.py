"""The PostgreSQL layer: the one owner of onceflow's tables.

Migrations (``migrations/NNNN_*.sql``), the migrator, and every statement on the
product tables live here, with typed results. The rest of the code reaches it through
four faces, each a package ``__init__`` naming what may be called (a contract in
``pyproject.toml`` forbids importing anything else of the store from outside it):

* this package: connecting, migrating, classifying database errors;
* :mod:`~workflow_engine.store.writes`: what the worker and the engines write (create,
  claim, checkpoints, waits, children, schedule firing, task runs, maintenance);
* :mod:`~workflow_engine.store.operations`: what operators do (control, bulk actions with
  their one background runner, events, re-drives, schedules, the audit trail);
* :mod:`~workflow_engine.store.views`: what is read (describe, the one list API, traces,
  job status, counts).

The modules behind the faces are the store's own. Shared pieces sit at this level
(``db``, ``fragments``, ``commands``, ``schema``, ``operator_audit``, ``partitions``,
``schedule_rows``). The product code has no SQL outside the store; the tools' own SQL is
benchmark and seed SQL on scratch databases, and lives in ``tools/``.
"""

from __future__ import annotations

from workflow_engine.store.db import (
    ErrorClass,
    check_connection,
    classify,
    constraint_of,
    database_ready,
    is_row_at_fault,
    is_transient,
    libpq_dsn,
    make_engine,
    refusal,
    retry_on_deadlock,
    shared_engine,
    sqlalchemy_url,
    sqlstate,
)
from workflow_engine.store.schema import (
    PRODUCT,
    Migration,
    MigrationEdited,
    MigrationSet,
    available_migrations,
    grant_app_role,
    migrate,
    migration_set_of,
)

__all__ = [
    "PRODUCT",
    "ErrorClass",
    "Migration",
    "MigrationEdited",
    "MigrationSet",
    "available_migrations",
    "check_connection",
    "classify",
    "constraint_of",
    "database_ready",
    "grant_app_role",
    "is_row_at_fault",
    "is_transient",
    "libpq_dsn",
    "make_engine",
    "migrate",
    "migration_set_of",
    "refusal",
    "retry_on_deadlock",
    "shared_engine",
    "sqlalchemy_url",
    "sqlstate",
]
