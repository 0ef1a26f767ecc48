"""The migrator and what the product migrations produce: the committed schema snapshot,
the declared tables, append-only migrations."""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import onceflow_examples
from onceflow_tools.schema_snapshot import SNAPSHOT, dump_schema
from onceflow_tools.stack import database_url_for, recreate_database
from workflow_engine.store import (
    PRODUCT,
    MigrationEdited,
    MigrationSet,
    available_migrations,
    make_engine,
    migrate,
)


@pytest.fixture
def fresh_db(base_settings) -> Iterator[tuple[Engine, str]]:
    """An empty database (no migrations at all) and its URL."""
    name = f"onceflow_s_{uuid.uuid4().hex[:10]}"
    url = recreate_database(base_settings.database_url, name)
    db = make_engine(url, pool_size=2)
    yield db, url
    db.dispose()
    admin = make_engine(database_url_for(base_settings.database_url, "postgres"), pool_size=1)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def product_db(fresh_db) -> tuple[Engine, str]:
    """A database migrated with the product migrations only."""
    db, _ = fresh_db
    applied = migrate(db)
    assert [m.label for m in applied] == [m.label for m in available_migrations()]
    return fresh_db


def _tables(db: Engine) -> set[str]:
    with db.connect() as conn:
        rows = conn.execute(
            # Partitions of the history tables (0012) are not tables of their own.
            sa.text(
                "SELECT c.relname FROM pg_class c"
                " WHERE c.relnamespace = current_schema()::regnamespace"
                " AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            )
        )
        return set(rows.scalars())


def test_the_committed_schema_is_what_the_migrations_produce(product_db):
    _, url = product_db
    dumped = dump_schema(url)
    committed = SNAPSHOT.read_text() if SNAPSHOT.exists() else ""
    diff = "".join(
        list(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                dumped.splitlines(keepends=True),
                "schema.sql (committed)",
                "schema.sql (from the migrations)",
            )
        )[:60]
    )
    assert dumped == committed, (
        f"{SNAPSHOT} differs from the schema the product migrations produce; regenerate it"
        f" with `onceflow dev schema-snapshot` and commit it:\n{diff}"
    )


def test_the_product_creates_exactly_its_declared_tables(product_db):
    db, _ = product_db
    tables = _tables(db)
    assert tables == {*PRODUCT.tables, PRODUCT.table}
    assert not [t for t in tables if t.startswith("onceflow_demo_")]


def test_the_examples_create_exactly_their_declared_tables(product_db):
    db, _ = product_db
    before = _tables(db)
    examples = onceflow_examples.MIGRATIONS
    assert migrate(db, examples)
    assert _tables(db) - before == {*examples.tables, examples.table}
    assert migrate(db, examples) == []


def test_migrating_twice_applies_nothing_the_second_time(product_db):
    db, _ = product_db
    assert migrate(db) == []
    with db.connect() as conn:
        recorded = conn.execute(sa.text(f"SELECT version FROM {PRODUCT.table}")).scalars()
        assert sorted(recorded) == [m.version for m in available_migrations()]


def test_missing_checksums_are_backfilled(product_db):
    db, _ = product_db
    with db.begin() as conn:  # as migrated before checksums were recorded
        conn.execute(sa.text(f"UPDATE {PRODUCT.table} SET checksum = NULL"))
    assert migrate(db) == []
    with db.connect() as conn:
        recorded = dict(
            conn.execute(sa.text(f"SELECT version, checksum FROM {PRODUCT.table}")).all()
        )
    assert recorded == {m.version: m.checksum for m in available_migrations()}


def _scratch_set(root: Path, monkeypatch) -> MigrationSet:
    """A migration set in a package of its own under ``root``, to edit its files."""
    package = f"scratch_migrations_{uuid.uuid4().hex[:8]}"
    (root / package).mkdir()
    (root / package / "__init__.py").touch()
    monkeypatch.syspath_prepend(str(root))
    return MigrationSet(
        name="scratch",
        package=package,
        table=f"{package}_record",
        tables=("scratch_a", "scratch_b"),
    )


def test_an_edited_applied_migration_is_refused(fresh_db, tmp_path, monkeypatch):
    db, _ = fresh_db
    scratch = _scratch_set(tmp_path, monkeypatch)
    files = tmp_path / scratch.package
    (files / "0002_b.sql").write_text("CREATE TABLE scratch_b (id int);\n")
    assert [m.label for m in migrate(db, scratch)] == ["0002_b"]

    # Edit the applied migration, and add a pending one that sorts before it.
    (files / "0002_b.sql").write_text("CREATE TABLE scratch_b (id bigint);\n")
    (files / "0001_a.sql").write_text("CREATE TABLE scratch_a (id int);\n")
    with pytest.raises(MigrationEdited, match=r"migration 0002_b of scratch was edited"):
        migrate(db, scratch)
    assert "scratch_a" not in _tables(db)  # the whole run was refused

    (files / "0002_b.sql").write_text("CREATE TABLE scratch_b (id int);\n")  # restored
    assert [m.label for m in migrate(db, scratch)] == ["0001_a"]
    assert {"scratch_a", "scratch_b"} <= _tables(db)
