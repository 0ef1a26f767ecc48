"""``workflow_engine/store/schema.sql``: the schema the product migrations produce.

The snapshot is what ``pg_dump --schema-only`` prints for a fresh database migrated
with the product's migrations (never the examples'), normalised so it is stable from
run to run: no comments, no session ``SET`` lines, no ``\\restrict`` keys, single blank
lines. Reviewers read a migration's effect in the snapshot's diff;
``tests/integration/test_schema.py`` fails when the two drift apart and
``onceflow dev schema-snapshot`` rewrites it.

The dump is made by the ``pg_dump`` of the server's own major version (the output
changes between versions), found where the Debian packages put it.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

import workflow_engine.store
from onceflow.errors import OnceflowError
from onceflow_tools.stack import database_url_for, recreate_database
from workflow_engine.store import PRODUCT, make_engine, migrate, sqlalchemy_url

#: The committed snapshot, beside the migrator that it describes.
SNAPSHOT = Path(workflow_engine.store.__file__).parent / "schema.sql"

HEADER = """\
-- GENERATED FILE, do not edit: the schema the product migrations
-- (workflow_engine/store/migrations) produce on a fresh database, from
-- pg_dump --schema-only --no-owner --no-privileges, normalised.
-- Regenerate after adding a migration: onceflow dev schema-snapshot
"""

# Lines that differ between runs or servers and say nothing about the schema.
_DROPPED_PREFIXES = ("--", "SET ", "SELECT pg_catalog.set_config(", "\\restrict", "\\unrestrict")


def pg_dump_for(db: sa.Engine) -> Path:
    """The ``pg_dump`` of the server's major version, else the newest one on PATH."""
    with db.connect() as conn:
        major = int(conn.execute(sa.text("SHOW server_version_num")).scalar_one()) // 10000
    packaged = Path(f"/usr/lib/postgresql/{major}/bin/pg_dump")
    if packaged.exists():
        return packaged
    found = shutil.which("pg_dump")
    if found is None:
        raise OnceflowError(f"no pg_dump for PostgreSQL {major}: install postgresql-client-{major}")
    return Path(found)


def normalise(dump: str) -> str:
    """``dump`` without the lines that vary between runs, with the header on top."""
    kept: list[str] = []
    for line in dump.splitlines():
        line = line.rstrip()
        if line.startswith(_DROPPED_PREFIXES):
            continue
        if not line and (not kept or not kept[-1]):
            continue  # one blank line at most, none at the start
        kept.append(line)
    while kept and not kept[-1]:
        kept.pop()
    return HEADER + "\n" + "\n".join(kept) + "\n"


def dump_schema(database_url: str) -> str:
    """The normalised schema of the database at ``database_url``."""
    # pg_dump takes the libpq form of the URL, without SQLAlchemy's driver name.
    url = make_url(sqlalchemy_url(database_url)).set(drivername="postgresql")
    db = make_engine(database_url, pool_size=1)
    try:
        pg_dump = pg_dump_for(db)
    finally:
        db.dispose()
    result = subprocess.run(
        [
            str(pg_dump),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            # The dated partitions of the history tables (migration 0012) depend on the
            # day the database was migrated; the partitioned tables and their default
            # partitions are the schema.
            "--exclude-table=onceflow_*_p2*",
            f"--dbname={url.render_as_string(hide_password=False)}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit code {result.returncode}"]
        raise OnceflowError(f"pg_dump failed: {lines[-1]}")
    return normalise(result.stdout)


def product_schema(base_url: str) -> str:
    """Migrate a scratch database on the server of ``base_url`` with the product
    migrations only, and return its normalised schema (the database is dropped)."""
    name = f"onceflow_snapshot_{uuid.uuid4().hex[:8]}"
    url = recreate_database(base_url, name)
    try:
        db = make_engine(url, pool_size=1)
        try:
            migrate(db, PRODUCT)
        finally:
            db.dispose()
        return dump_schema(url)
    finally:
        admin = make_engine(database_url_for(base_url, "postgres"), pool_size=1)
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def write_snapshot(base_url: str, path: Path = SNAPSHOT) -> bool:
    """Rewrite the snapshot at ``path``; return whether its text changed."""
    text = product_schema(base_url)
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
