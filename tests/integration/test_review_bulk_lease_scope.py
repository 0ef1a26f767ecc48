"""A bulk operation's lease is its database's, not the server's (found in review).

The lease is a session-level advisory lock on the operation's id, and advisory locks
are per database: ``pg_try_advisory_lock`` in one database never waits for the same
key taken in another. But :func:`workflow_engine.store.operations.bulk.unleased` reads
``pg_locks``, which lists the locks of every database on the server, without its
``database`` column: two deployments on one server (staging and production, each its
own database, operation ids both counting from 1) hide each other's cut-off
operations. Production's operation #1, left ``running`` by a SIGKILL, is not resumed
while staging runs its own #1. Real PostgreSQL.
"""

from __future__ import annotations

import sqlalchemy as sa

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import BulkAction
from onceflow_tools.stack import database_url_for
from workflow_engine.model import Delivery
from workflow_engine.store import make_engine, operations
from workflow_engine.store.views import InstanceFilter
from workflow_engine.store.writes import create_instances


def test_an_operation_leased_in_another_database_does_not_hide_this_ones(settings, db, db_url):
    create_instances(db, [Delivery(JobEnvelope("lease_1", "order-workflow", {}), "t", 0, 0)])
    op = operations.start_bulk(db, BulkAction.PAUSE, InstanceFilter.parse("prefix=lease_"))
    assert not op.finished and operations.unleased(db) == [op.id]  # cut off: nobody holds it

    # Another deployment's runner, in another database of the same server, runs its
    # own operation of the same id (its lease: the same two-key advisory lock).
    other = make_engine(database_url_for(db_url, "postgres"), pool_size=1)
    try:
        with other.connect() as conn:
            key = {"space": operations.LEASE_LOCK_SPACE, "key": op.id}
            assert conn.execute(sa.text("SELECT pg_try_advisory_lock(:space, :key)"), key).scalar()
            # This database's lease is still free: a runner here could take it ...
            with operations.leased(db, op.id) as here:
                assert here is not None
            # ... so the operation is one to resume.
            assert operations.unleased(db) == [op.id]
    finally:
        other.dispose()
