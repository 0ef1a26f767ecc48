"""Every SQL block in docs/queries.md runs against the current schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import DeadLetterReason
from workflow_engine.model import Delivery
from workflow_engine.store.views import DeadLetterRow
from workflow_engine.store.writes import create_instances, record_dead_letters

DOC = Path(__file__).resolve().parents[2] / "docs" / "queries.md"
BLOCKS = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_queries():
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("sql", BLOCKS, ids=[f"query{i}" for i in range(len(BLOCKS))])
def test_query_runs(db, sql):
    create_instances(
        db,
        [
            Delivery(JobEnvelope("order_1001", "order-workflow", {}), "t", 0, 0),
            Delivery(JobEnvelope("order_1001", "order-workflow", {"x": 1}), "t", 0, 1),
            Delivery(JobEnvelope("order_1001", "refund-workflow", {}), "t", 0, 2),
        ],
    )
    dead = DeadLetterRow(
        "t",
        0,
        3,
        "order_1001",
        DeadLetterReason.UNKNOWN_TYPE,
        "unknown type 'x'",
        10,
        "0" * 64,
        False,
        "t.dlq",
        0,
        0,
        {},
    )
    record_dead_letters(db, [dead])
    with db.begin() as conn:  # a webhook delivery and its attempt, as the dispatcher writes
        conn.exec_driver_sql(
            "WITH d AS (INSERT INTO onceflow_webhook_deliveries (event_id, endpoint, job_id,"
            " workflow, kind, sequence, body, give_up_at) VALUES ('order_1001:1', 'billing',"
            " 'order_1001', 'order-workflow', 'instance.complete', 1, '{}', now()) RETURNING id)"
            " INSERT INTO onceflow_webhook_attempts (delivery_id, attempt, claim_count, owner,"
            " response_code, outcome) SELECT id, 1, 1, 'test', 500, 'failed' FROM d"
        )
    with db.connect() as conn:
        rows = conn.exec_driver_sql(sql.strip().rstrip(";")).all()
    # Running without an error is the main check; where the example data must show, it does.
    shows_example = ("'order_1001'", "NOT d.params_match", "workflow_match IS FALSE", "reason")
    if any(marker in sql for marker in shows_example) or "Duplicates" in sql:
        assert rows
