"""Id reuse policies (issue 26, item 8): the one rule for a policy's name that
``@workflow(id_reuse=)``, ingest's 422 and the worker's dead letter share; a job's own
policy only as strict as its workflow's or stricter; what each policy follows."""

from __future__ import annotations

import orjson
import pytest

from onceflow.envelope import JobEnvelope, id_reuse_policy
from onceflow.errors import InvalidEnvelope
from onceflow.vocabulary import DeadLetterReason, IdReuse, InstanceStatus
from producers.errors import RequestError
from producers.models import parse_jobs
from streams.records import RawRecord, classify
from workflow_engine import workflow
from workflow_engine.definitions import REGISTRY
from workflow_engine.model import Registry, WorkflowDef


def test_the_policies_and_what_they_follow():
    assert id_reuse_policy(None) is None
    assert id_reuse_policy("after_failure") is IdReuse.AFTER_FAILURE
    assert IdReuse.NEVER.reusable == frozenset()
    failed = {InstanceStatus.ERRORED, InstanceStatus.TERMINATED}
    assert IdReuse.AFTER_FAILURE.reusable == failed
    assert IdReuse.AFTER_COMPLETION.reusable == failed | {
        InstanceStatus.COMPLETE,
        InstanceStatus.SKIPPED,
        InstanceStatus.DEBOUNCED,  # never ran, as a skip (a workflow changed since)
    }
    order = sorted(IdReuse, key=lambda p: p.strictness)
    assert order == [IdReuse.AFTER_COMPLETION, IdReuse.AFTER_FAILURE, IdReuse.NEVER]


@pytest.mark.parametrize("bad", ["always", "NEVER", "", 1, True, ["never"]])
def test_a_bad_name_is_refused_everywhere_with_one_reason(bad):
    with pytest.raises(ValueError, match=r"invalid id_reuse .*one of never, after_failure"):
        id_reuse_policy(bad)
    with pytest.raises(ValueError, match="workflow 'test-bad-reuse': invalid id_reuse"):
        workflow("test-bad-reuse", id_reuse=bad)
    raw = orjson.dumps({"job_id": "j_1", "workflow": "w", "params": {}, "id_reuse": bad})
    with pytest.raises(InvalidEnvelope) as caught:
        JobEnvelope.decode(b"j_1", raw)
    assert caught.value.reason == DeadLetterReason.INVALID_ID_REUSE
    if isinstance(bad, str):  # the model takes only strings (a number is its own 422)
        with pytest.raises(RequestError) as refused:
            parse_jobs(orjson.dumps({"workflow": "w", "id_reuse": bad}), 100, 10_000)
        assert (refused.value.status, refused.value.body.error) == (422, "invalid_id_reuse")
        assert refused.value.body.fields[0].field == "id_reuse"


def test_the_decorator_records_the_policy_default_never():
    @workflow("test-unit-reuse", id_reuse="after_completion")
    async def reused(ctx, params):
        return None

    assert REGISTRY.id_reuse("test-unit-reuse") is IdReuse.AFTER_COMPLETION
    assert REGISTRY.id_reuse("no-such-workflow") is IdReuse.NEVER
    assert (
        JobEnvelope.decode(
            None, orjson.dumps({"job_id": "j", "workflow": "w", "params": {}})
        ).id_reuse
        is None
    )


def _registry() -> Registry:
    async def fn(ctx, params):
        return None

    registry = Registry()
    registry.add_workflow(WorkflowDef(fn, "w", "v1", id_reuse=IdReuse.AFTER_FAILURE))
    return registry


def _record(offset: int, **fields) -> RawRecord:
    env = JobEnvelope(f"j_{offset}", fields.pop("workflow", "w"), {}, **fields)
    return RawRecord("t", 0, offset, env.key(), env.encode(), env.headers())


def test_a_job_may_only_ask_for_a_stricter_policy():
    records = [
        _record(0),
        _record(1, id_reuse=IdReuse.NEVER),
        _record(2, id_reuse=IdReuse.AFTER_FAILURE),
        _record(3, id_reuse=IdReuse.AFTER_COMPLETION),  # looser than the workflow's
    ]
    deliveries, dead = classify(records, 10_000, _registry())
    assert [d.id_reuse for d in deliveries] == [
        IdReuse.AFTER_FAILURE,  # the workflow's
        IdReuse.NEVER,
        IdReuse.AFTER_FAILURE,
    ]
    [letter] = dead
    assert letter.reason == DeadLetterReason.INVALID_ID_REUSE
    assert "looser than workflow 'w''s 'after_failure'" in letter.detail
