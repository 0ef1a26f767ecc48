"""The services' database role can do everything onceflow does, and cannot change the
schema; migrations run as the owner."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import onceflow_examples
from onceflow.envelope import JobEnvelope
from workflow_engine.model import Delivery
from workflow_engine.store import PRODUCT, grant_app_role, make_engine, sqlalchemy_url
from workflow_engine.store.views import describe_instance
from workflow_engine.store.writes import create_instances


@pytest.fixture
def app_role(db):
    role = f"onceflow_app_{uuid.uuid4().hex[:8]}"
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')  # test-made name, no input
    yield role
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
        conn.exec_driver_sql(f'DROP ROLE "{role}"')


def test_app_role_works_but_cannot_change_the_schema(db, db_url, app_role):
    assert "onceflow_instances" in grant_app_role(db, app_role)
    url = make_url(sqlalchemy_url(db_url)).set(username=app_role, password=None)
    app = make_engine(url.render_as_string(hide_password=False), pool_size=1)
    try:
        result = create_instances(
            app, [Delivery(JobEnvelope("r1", "order-workflow", {}), "t", 0, 0)]
        )
        assert result.created == 1
        assert describe_instance(app, "r1").status == "queued"
        with app.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM job_trace('r1')")).scalar() > 0
        for ddl in (
            "ALTER TABLE onceflow_instances ADD COLUMN x int",
            "DROP TABLE onceflow_steps",
            "CREATE TABLE sneaky (id int)",
            "DELETE FROM onceflow_migrations",
        ):
            with (
                pytest.raises(sa.exc.ProgrammingError, match=r"permission denied|must be owner"),
                app.begin() as conn,
            ):
                conn.exec_driver_sql(ddl)
    finally:
        app.dispose()


def _privileges(db, role: str, table: str) -> set[str]:
    with db.connect() as conn:
        return {
            privilege
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE")
            if conn.execute(
                sa.text("SELECT has_table_privilege(:r, :t, :p)"),
                {"r": role, "t": table, "p": privilege},
            ).scalar()
        }


def test_app_role_gets_the_examples_tables_only_when_asked(db, app_role):
    examples = onceflow_examples.MIGRATIONS
    granted = grant_app_role(db, app_role, (PRODUCT,))
    assert set(granted) == set(PRODUCT.tables)
    for table in (*examples.tables, examples.table):
        assert _privileges(db, app_role, table) == set(), table
    assert _privileges(db, app_role, "onceflow_instances") == {
        "SELECT",
        "INSERT",
        "UPDATE",
        "DELETE",
    }

    granted = grant_app_role(db, app_role, (PRODUCT, examples))
    assert set(examples.tables) <= set(granted)
    for table in examples.tables:
        assert _privileges(db, app_role, table) == {"SELECT", "INSERT", "UPDATE", "DELETE"}
    assert _privileges(db, app_role, examples.table) == {"SELECT"}
