"""Numbered SQL migrations, applied in order under an advisory lock.

Files ``migrations/NNNN_name.sql`` are applied once each and recorded in
``onceflow_migrations``; two processes migrating at once serialise on the lock.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

# Arbitrary, fixed: the key of the advisory lock that serialises migrations.
MIGRATION_LOCK_KEY = 0x0CEF_1000
_NAME_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("workflow_engine.migrations").iterdir():
        match = _NAME_RE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def applied_versions(engine: Engine) -> set[int]:
    with engine.connect() as conn:
        exists = conn.execute(sa.text("SELECT to_regclass('onceflow_migrations')")).scalar()
        if exists is None:
            return set()
        return set(conn.execute(sa.text("SELECT version FROM onceflow_migrations")).scalars())


def migrate(engine: Engine) -> list[Migration]:
    """Apply every pending migration; return the ones applied by this call."""
    applied: list[Migration] = []
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        conn.execute(
            sa.text(
                "CREATE TABLE IF NOT EXISTS onceflow_migrations ("
                " version integer NOT NULL CONSTRAINT onceflow_migrations_pkey PRIMARY KEY,"
                " name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
        )
        done = set(conn.execute(sa.text("SELECT version FROM onceflow_migrations")).scalars())
        for migration in available_migrations():
            if migration.version in done:
                continue
            # exec_driver_sql: the files are plain SQL with no bind parameters.
            conn.exec_driver_sql(migration.sql)
            conn.execute(
                sa.text("INSERT INTO onceflow_migrations (version, name) VALUES (:v, :n)"),
                {"v": migration.version, "n": migration.name},
            )
            applied.append(migration)
            log.info(
                "applied migration %04d_%s",
                migration.version,
                migration.name,
                extra={"event": "schema.migrated", "version": migration.version},
            )
    return applied


def grant_app_role(engine: Engine, role: str) -> list[str]:
    """Let ``role`` read and write onceflow's rows, and nothing more.

    The services connect as this role: it can run every query onceflow makes but cannot
    create, alter or drop anything (only the role that ran the migrations owns the
    tables). Identifiers are quoted by the driver, never spliced into SQL text.
    """
    from psycopg2 import sql

    granted: list[str] = []
    with engine.begin() as conn:
        tables = (
            conn.execute(
                sa.text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                    " AND tablename LIKE 'onceflow\\_%'"
                )
            )
            .scalars()
            .all()
        )
        sequences = (
            conn.execute(
                sa.text(
                    "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"
                    " AND sequencename LIKE 'onceflow\\_%'"
                )
            )
            .scalars()
            .all()
        )
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        who = sql.Identifier(role)
        cursor.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(conn.execute(sa.text("SELECT current_schema()")).scalar()), who
            )
        )
        for table in tables:
            privileges = (
                "SELECT" if table == "onceflow_migrations" else "SELECT, INSERT, UPDATE, DELETE"
            )
            cursor.execute(
                sql.SQL("GRANT " + privileges + " ON TABLE {} TO {}").format(
                    sql.Identifier(table), who
                )
            )
            granted.append(table)
        for sequence in sequences:
            cursor.execute(
                sql.SQL("GRANT USAGE, SELECT ON SEQUENCE {} TO {}").format(
                    sql.Identifier(sequence), who
                )
            )
        cursor.execute(sql.SQL("GRANT EXECUTE ON FUNCTION job_trace(text) TO {}").format(who))
    return granted
