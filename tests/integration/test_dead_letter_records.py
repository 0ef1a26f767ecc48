"""Dead-lettered records in the database (issue 17, defect 9 part): recorded once per
source position, and every reader - job_trace, ``instances describe``, ``GET
/v1/jobs/{id}`` - says that a job id was dead-lettered, why and where."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from fastapi.testclient import TestClient

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import DeadLetterReason
from producers.api import create_app
from workflow_engine.model import Delivery
from workflow_engine.store import constraint_of
from workflow_engine.store.views import (
    DeadLetterRow,
    dead_letter_counts,
    dead_letter_sources,
    dead_letters_for,
    job_trace,
)
from workflow_engine.store.writes import create_instances, record_dead_letters


def dead(offset, job_id="dl_1", reason=DeadLetterReason.UNKNOWN_TYPE, dlq_offset=0, **kw):
    value = b'{"job_id": "dl_1", "workflow": "nope", "params": {}}'
    fields = {
        "source_topic": "jobs",
        "source_partition": 2,
        "source_offset": offset,
        "job_id": job_id,
        "reason": reason,
        "detail": "unknown workflow or task type 'nope'",
        "original_size": len(value),
        "sha256": hashlib.sha256(value).hexdigest(),
        "truncated": False,
        "dlq_topic": "jobs.dlq",
        "dlq_partition": 0 if dlq_offset is not None else None,
        "dlq_offset": dlq_offset,
        "headers": {"onceflow-job-id": "dl_1"},
        **kw,
    }
    return DeadLetterRow(**fields)


def count(db, sql):
    with db.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


def test_recording_is_idempotent_per_source_position(db):
    rows = [dead(7), dead(8, job_id=None, reason=DeadLetterReason.NOT_JSON, dlq_offset=None)]
    assert record_dead_letters(db, rows) == 2
    assert record_dead_letters(db, rows) == 0  # redelivered, dead-lettered again
    assert record_dead_letters(db, [dead(7), dead(9)]) == 1
    assert count(db, "SELECT count(*) FROM onceflow_dead_letters") == 3
    assert dead_letter_counts(db) == {
        DeadLetterReason.UNKNOWN_TYPE: 2,
        DeadLetterReason.NOT_JSON: 1,
    }
    assert dead_letter_sources(db) == {
        "jobs/2@7": DeadLetterReason.UNKNOWN_TYPE,
        "jobs/2@8": DeadLetterReason.NOT_JSON,
        "jobs/2@9": DeadLetterReason.UNKNOWN_TYPE,
    }
    found = dead_letters_for(db, "dl_1")
    assert [(v.source, v.dlq, v.reason) for v in found] == [
        ("jobs/2@7", "jobs.dlq/0@0", DeadLetterReason.UNKNOWN_TYPE),
        ("jobs/2@9", "jobs.dlq/0@0", DeadLetterReason.UNKNOWN_TYPE),
    ]
    assert found[0].headers == {"onceflow-job-id": "dl_1"}


def test_the_database_refuses_a_reason_outside_the_vocabulary(db):
    with pytest.raises(ValueError, match="not a valid DeadLetterReason"):
        record_dead_letters(db, [dead(1, reason="bogus")])  # refused before the database
    with pytest.raises(sa.exc.IntegrityError) as caught, db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceflow_dead_letters (source_topic, source_partition,"
                " source_offset, reason, original_size, sha256, dlq_topic)"
                " VALUES ('jobs', 0, 1, 'bogus', 1, 'x', 'jobs.dlq')"
            )
        )
    assert constraint_of(caught.value) == "onceflow_dead_letters_reason_check"


def test_job_trace_shows_the_dead_letter(db):
    record_dead_letters(db, [dead(7)])
    events = job_trace(db, "dl_1")
    assert [(e.event, e.layer) for e in events] == [("dead-lettered", "streams")]
    assert events[0].detail == (
        "unknown_type: unknown workflow or task type 'nope' (from jobs/2@7 to jobs.dlq/0@0)"
    )


@pytest.fixture
def describe(settings, monkeypatch):
    import importlib

    main = importlib.import_module("onceflow_cli.main")  # the package exports main()
    monkeypatch.setattr(main, "_settings", lambda: settings)

    def run(*args):
        return CliRunner().invoke(main.cli, ["instances", "describe", *args])

    return run


def test_describe_names_what_the_id_is_instead_of_no_instance(db, describe):
    env = JobEnvelope("mine", "order-workflow", {}, "req_1")
    create_instances(db, [Delivery(env, "jobs", 0, 1)])
    record_dead_letters(db, [dead(7)])

    other = describe("refund-workflow", "mine")
    assert other.exit_code != 0
    assert str(other.exception) == (
        "job id 'mine' belongs to workflow 'order-workflow' (status queued), not 'refund-workflow'"
    )
    gone = describe("order-workflow", "dl_1")
    assert str(gone.exception) == (
        "job id 'dl_1' has no instance: it was dead-lettered: unknown_type (unknown workflow"
        " or task type 'nope'); record jobs/2@7, dead letter jobs.dlq/0@0"
    )
    nothing = describe("order-workflow", "never")
    assert str(nothing.exception) == "no instance of 'order-workflow' with job id 'never'"
    found = describe("order-workflow", "mine")
    assert found.exit_code == 0, found.output
    assert "(HTTP request req_1)" in found.output
    assert "0 naming another workflow" in found.output


class _NoKafka:
    async def send(self, envelopes):
        raise AssertionError("nothing is sent")

    def ready(self):
        return True

    def close(self):
        return 0


def test_get_job_says_dead_lettered_why_and_where(db, settings):
    record_dead_letters(db, [dead(7)])
    app = create_app(
        settings.model_copy(update={"admin_api_enabled": True, "ingest_validate_types": False}),
        _NoKafka(),
    )
    with TestClient(app) as client:
        got = client.get("/v1/jobs/dl_1")
    assert got.status_code == 410
    body = got.json()
    # The unified error body (error, message, details); FastAPI's {"detail": …} before it.
    flat = body if "details" in body else body["detail"]
    detail = body.get("details", body.get("detail"))
    assert (flat["error"], detail["job_id"]) == ("dead_lettered", "dl_1")
    assert "unknown_type" in flat["message"] and "jobs/2@7" in flat["message"]
    (letter,) = detail["dead_letters"]
    assert (letter["reason"], letter["detail"]) == (
        "unknown_type",
        "unknown workflow or task type 'nope'",
    )
    assert (letter["source_topic"], letter["source_partition"], letter["source_offset"]) == (
        "jobs",
        2,
        7,
    )
    assert (letter["dlq_topic"], letter["dlq_partition"], letter["dlq_offset"]) == (
        "jobs.dlq",
        0,
        0,
    )
