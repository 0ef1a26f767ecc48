from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from onceflow.settings import settings_env  # noqa: F401  (tests import it from here)

# Tests control the settings they use: scrub the app's own variables first.
# ONCEFLOW_TEST_* are the tests' own switches (e.g. ONCEFLOW_TEST_SCREENSHOTS_DIR), kept.
for _name in [
    n for n in os.environ if n.startswith("ONCEFLOW_") and not n.startswith("ONCEFLOW_TEST_")
]:
    del os.environ[_name]


#: The topics this session's ``settings`` fixtures made: deleted in one request at the
#: end (``pytest_sessionfinish``), since a dev broker that outlives many sessions runs
#: out of file descriptors on their partitions; only this session's own topics, as other
#: sessions may share the broker.
_TOPICS_MADE: dict[str, list[str]] = {}  # by bootstrap servers


def pytest_sessionfinish(session: pytest.Session) -> None:
    from onceflow.settings import Settings
    from onceflow_tools.stack import delete_topics

    for bootstrap, names in _TOPICS_MADE.items():
        delete_topics(Settings(kafka_bootstrap_servers=bootstrap), names, timeout=30)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path)
        if "/integration/" in path:
            item.add_marker(pytest.mark.integration)
        elif "/acceptance/" in path:
            item.add_marker(pytest.mark.acceptance)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator:
    """A test stopped by pytest-timeout gets every thread's stack in its own report,
    first: pytest-timeout prints them amid the progress output, which a CI summary of
    the failures leaves out (the stacks say what hung, the failure only where it waited)."""
    report = yield
    if report.failed and call.excinfo is not None and "Timeout" in str(call.excinfo.value):
        report.sections.insert(0, ("threads when the test timed out", _thread_stacks()))
    return report


def _thread_stacks() -> str:
    import sys
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, '?')} ({ident})")
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
    return "\n".join(out)


@pytest.fixture(scope="session")
def services() -> Iterator:
    from tests.services import Services

    svc = Services().start()
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def base_settings(services):
    from onceflow.settings import Settings

    return Settings(
        kafka_bootstrap_servers=services.kafka,
        database_url=services.database_url,
        workflow_modules=["onceflow_examples"],  # the samples the tests run
    )


@pytest.fixture(scope="session")
def template_db(base_settings) -> Iterator[str]:
    """A migrated database (the product's schema and the examples') that per-test
    databases are copied from; dropped at the end of the session (a server used for
    many sessions otherwise collects one per run, and autovacuum visits them all)."""
    import sqlalchemy as sa

    import onceflow_examples
    from onceflow_tools.stack import database_url_for, recreate_database
    from workflow_engine.store import make_engine, migrate

    name = f"onceflow_tpl_{uuid.uuid4().hex[:8]}"
    url = recreate_database(base_settings.database_url, name)
    db = make_engine(url, pool_size=1)
    migrate(db)
    migrate(db, onceflow_examples.MIGRATIONS)
    db.dispose()
    yield name
    admin = make_engine(database_url_for(base_settings.database_url, "postgres"), pool_size=1)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def db_url(base_settings, template_db) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    import sqlalchemy as sa

    from onceflow_tools.stack import database_url_for
    from workflow_engine.store import make_engine

    name = f"onceflow_t_{uuid.uuid4().hex[:10]}"
    admin = make_engine(database_url_for(base_settings.database_url, "postgres"), pool_size=1)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"'))
    yield database_url_for(base_settings.database_url, name)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def db(db_url):
    from workflow_engine.store import make_engine

    db = make_engine(db_url, pool_size=4)
    yield db
    db.dispose()


@pytest.fixture
def settings(base_settings, db_url, tmp_path):
    """Settings for one test: its own database, topics and consumer group."""
    from onceflow.topics import ensure_topics
    from onceflow_tools.stack import run_topics

    run = uuid.uuid4().hex[:8]
    s = base_settings.model_copy(
        update={
            "database_url": db_url,
            "jobs_topic": f"test.{run}.jobs",
            "dlq_topic": f"test.{run}.jobs.dlq",
            "events_topic": f"test.{run}.events",
            "consumer_group": f"test-{run}",
            "state_dir": tmp_path / "state",
            "auth_disabled": True,  # tests of API keys turn it back on explicitly
        }
    )
    ensure_topics(s)
    _TOPICS_MADE.setdefault(s.kafka_bootstrap_servers, []).extend(run_topics(s))
    return s
