"""Numbered SQL migrations, applied in order under an advisory lock.

Files ``migrations/NNNN_name.sql`` are applied once each and recorded, with the
sha256 of their text, in ``onceflow_migrations``; two processes migrating at once
serialise on the lock. Applied migrations are append-only: a file edited after it was
applied is refused with a clear message (add a new migration instead). Databases
migrated before checksums were recorded get the current checksum on their next run.

``schema.sql`` beside this module is the schema the product migrations produce
(``pg_dump --schema-only``, normalised); a test fails when the two differ, and
``onceflow dev schema-snapshot`` rewrites it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import sqlalchemy as sa
from psycopg2 import sql
from sqlalchemy.engine import Connection, Engine

from onceflow.errors import OnceflowError

log = logging.getLogger(__name__)

# Arbitrary, fixed: the key of the advisory lock that serialises migrations.
MIGRATION_LOCK_KEY = 0x0CEF_1000
_NAME_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class MigrationSet:
    """A numbered series of migrations with its own record table.

    The product's is :data:`PRODUCT`; an opt-in workflow module (the examples) brings
    its own for the tables its steps write to, so those never enter the product schema.
    ``tables`` are the tables the set creates: what ``grant_app_role`` grants on.
    """

    name: str
    package: str
    table: str
    tables: tuple[str, ...]


#: The product's migrations and tables (``tests/integration/test_schema.py`` checks the
#: list against what the migrations create).
PRODUCT = MigrationSet(
    name="onceflow",
    package="workflow_engine.store.migrations",
    table="onceflow_migrations",
    tables=(
        "onceflow_jobs",
        "onceflow_duplicate_deliveries",
        "onceflow_instances",
        "onceflow_steps",
        "onceflow_step_attempts",
        "onceflow_events",
        "onceflow_task_runs",
        "onceflow_dead_letters",
        "onceflow_engines",
        "onceflow_bulk_operations",
        "onceflow_bulk_operation_items",
        "onceflow_schedules",
        "onceflow_schedule_ticks",
        "onceflow_rate_starts",
        "onceflow_flow_controls",
        "onceflow_operator_actions",
        "onceflow_outbox",
        "onceflow_webhook_deliveries",
        "onceflow_webhook_attempts",
        "onceflow_streams",
        "onceflow_stream_values",
        "onceflow_runs",
    ),
)


def migration_set_of(module: str) -> MigrationSet:
    """The :class:`MigrationSet` a workflow module declares as ``MIGRATIONS``."""
    from importlib import import_module

    try:
        found = getattr(import_module(module), "MIGRATIONS", None)
    except ImportError as exc:
        raise OnceflowError(f"cannot import workflow module {module!r}: {exc}") from None
    if not isinstance(found, MigrationSet):
        raise OnceflowError(f"workflow module {module!r} declares no MIGRATIONS")
    return found


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


class MigrationEdited(OnceflowError):
    """An applied migration's file changed afterwards."""


def available_migrations(migration_set: MigrationSet = PRODUCT) -> list[Migration]:
    found = []
    for entry in resources.files(migration_set.package).iterdir():
        match = _NAME_RE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


_MIGRATION_LOCK = sa.text("SELECT pg_advisory_xact_lock(:k)")

# The statements on a migration set's record table name that table, which comes from a
# MigrationSet in code, never from input: templates, made statements by _on_table.
_CREATE_RECORD_TABLE = (
    "CREATE TABLE IF NOT EXISTS {table} ("
    " version integer NOT NULL CONSTRAINT {table}_pkey PRIMARY KEY,"
    " name text NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now(),"
    " checksum text)"
)
_ADD_CHECKSUM = "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS checksum text"
_APPLIED = "SELECT version, checksum FROM {table}"
_SET_CHECKSUM = "UPDATE {table} SET checksum = :c WHERE version = :v"
_RECORD = "INSERT INTO {table} (version, name, checksum) VALUES (:v, :n, :c)"


def _on_table(template: str, table: str) -> sa.TextClause:
    """One of the record-table templates above, on the migration set's own table."""
    return sa.text(template.format(table=table))


def _ensure_record_table(conn: Connection, table: str) -> None:
    conn.execute(_on_table(_CREATE_RECORD_TABLE, table))
    conn.execute(_on_table(_ADD_CHECKSUM, table))


def migrate(db: Engine, migration_set: MigrationSet = PRODUCT) -> list[Migration]:
    """Apply every pending migration of ``migration_set``; return those applied now.

    Raises :class:`MigrationEdited` (and applies nothing) when an applied migration's
    file no longer matches the checksum recorded when it was applied.
    """
    applied: list[Migration] = []
    table = migration_set.table
    with db.begin() as conn:
        conn.execute(_MIGRATION_LOCK, {"k": MIGRATION_LOCK_KEY})
        _ensure_record_table(conn, table)
        done: dict[int, str | None] = dict(conn.execute(_on_table(_APPLIED, table)).all())
        for migration in available_migrations(migration_set):
            if migration.version in done:
                recorded = done[migration.version]
                if recorded is None:  # applied before checksums were kept
                    conn.execute(
                        _on_table(_SET_CHECKSUM, table),
                        {"c": migration.checksum, "v": migration.version},
                    )
                elif recorded != migration.checksum:
                    raise MigrationEdited(
                        f"migration {migration.label} of {migration_set.name} was edited after"
                        f" it was applied (sha256 {recorded[:12]}… recorded,"
                        f" {migration.checksum[:12]}… on disk): applied migrations are"
                        " append-only; restore the file and add a new migration instead"
                    )
                continue
            # The files are plain SQL with no bind parameters: run them on the driver's
            # cursor with no parameters at all, so that a percent sign (plpgsql's
            # format('%s')) is not read as a placeholder (exec_driver_sql passes {}).
            cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
            cursor.execute(migration.sql)
            conn.execute(
                _on_table(_RECORD, table),
                {"v": migration.version, "n": migration.name, "c": migration.checksum},
            )
            applied.append(migration)
            log.info(
                "applied migration %s of %s",
                migration.label,
                migration_set.name,
                extra={"event": "schema.migrated", "version": migration.version},
            )
    return applied


_CURRENT_SCHEMA = sa.text("SELECT current_schema()")


def grant_app_role(
    db: Engine, role: str, migration_sets: tuple[MigrationSet, ...] = (PRODUCT,)
) -> list[str]:
    """Let ``role`` read and write the rows of the given sets' tables, and nothing more.

    The services connect as this role: it can run every query onceflow makes but cannot
    create, alter or drop anything (only the role that ran the migrations owns the
    tables). It gets the product's tables, plus those of any opt-in set passed here
    (the examples'); never a table no migration set declares. Identifiers are quoted
    by the driver, never spliced into SQL text.
    """
    with db.begin() as conn:
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        who = sql.Identifier(role)
        schema = conn.execute(_CURRENT_SCHEMA).scalar()
        cursor.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), who)
        )
        granted = _grant_tables(cursor, who, migration_sets)
        _grant_sequences(conn, cursor, who, granted)
        _grant_functions(cursor, who)
    return granted


def _grant_tables(
    cursor: Any, who: sql.Identifier, migration_sets: tuple[MigrationSet, ...]
) -> list[str]:
    """Grant reading each set's migrations table, and the rows of each of its tables;
    returns the tables granted."""
    granted: list[str] = []
    for migration_set in migration_sets:
        cursor.execute(
            sql.SQL("GRANT SELECT ON TABLE {} TO {}").format(
                sql.Identifier(migration_set.table), who
            )
        )
        for table in migration_set.tables:
            cursor.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {} TO {}").format(
                    sql.Identifier(table), who
                )
            )
            granted.append(table)
    return granted


_SEQUENCES_OF = sa.text(
    "SELECT s.sequencename FROM pg_sequences s"
    " JOIN pg_depend d ON d.objid = to_regclass(s.sequencename)"
    " JOIN pg_class c ON c.oid = d.refobjid"
    " WHERE s.schemaname = current_schema() AND c.relname = ANY(:tables)"
)


def _grant_sequences(conn: Connection, cursor: Any, who: sql.Identifier, tables: list[str]) -> None:
    """Grant the use of the sequences the granted ``tables`` own (their serial columns')."""
    sequences = conn.execute(_SEQUENCES_OF, {"tables": tables}).scalars().all()
    for sequence in sequences:
        cursor.execute(
            sql.SQL("GRANT USAGE, SELECT ON SEQUENCE {} TO {}").format(
                sql.Identifier(sequence), who
            )
        )


def _grant_functions(cursor: Any, who: sql.Identifier) -> None:
    """Grant executing the functions the services call (the trace, retention's partitions)."""
    cursor.execute(sql.SQL("GRANT EXECUTE ON FUNCTION job_trace(text) TO {}").format(who))
    # Retention's partition DDL runs in these SECURITY DEFINER functions (0012).
    for function in (
        "onceflow_add_partition(text, timestamptz, timestamptz)",
        "onceflow_retire_partition(text, timestamptz)",
    ):
        cursor.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(function), who))
