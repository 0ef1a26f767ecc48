"""Batching declarations (issue 26, item 2): checked when the module loads."""

from __future__ import annotations

from datetime import timedelta

import pytest

from onceflow.ticks import Schedule
from workflow_engine import Batch, RateLimit, Singleton
from workflow_engine.definitions import workflow
from workflow_engine.model import Registry, batch_policy, batch_result_problem


async def _fn(ctx, params):
    return []


def test_a_declaration_is_checked_and_kept():
    policy = batch_policy(Batch(max_size=100, max_wait=timedelta(seconds=2), key="params.tenant"))
    assert (policy.max_size, policy.max_wait, policy.key) == (100, 2.0, ("tenant",))
    assert batch_policy(Batch(max_size=2, max_wait=0.5)).key == ()


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (Batch(max_size=1, max_wait=1), "max_size must be an integer from 2"),
        (Batch(max_size=1001, max_wait=1), "max_size must be an integer from 2"),
        (Batch(max_size=True, max_wait=1), "max_size"),
        (Batch(max_size=10, max_wait=0), "max_wait must be more than 0"),
        (Batch(max_size=10, max_wait=-1), "max_wait"),
        (Batch(max_size=10, max_wait=86401), "at most a day"),
        (Batch(max_size=10, max_wait=1, key="tenant"), "a dotted path on params"),
    ],
)
def test_bad_declarations_are_refused(batch, message):
    with pytest.raises(ValueError, match=message):
        batch_policy(batch)


@pytest.mark.parametrize(
    ("options", "clash"),
    [
        ({"concurrency": 2}, "flow control"),
        ({"concurrency_key": "params.t"}, "flow control"),
        ({"rate_limit": RateLimit(5)}, "flow control"),
        ({"fairness_key": "params.t"}, "flow control"),
        ({"singleton": Singleton("params.t", "skip")}, "flow control"),
        ({"schedule": Schedule(timedelta(minutes=5))}, "a schedule"),
        ({"start_within": 60}, "start_within"),
    ],
)
def test_combinations_that_make_no_sense_are_refused_at_registration(options, clash):
    with pytest.raises(ValueError, match=f"batch cannot be combined with {clash}"):
        workflow("unit-batch-clash", batch=Batch(5, 1.0), **options)


def test_the_registry_knows_the_batched_workflows(monkeypatch):
    registry = Registry()
    monkeypatch.setattr("workflow_engine.definitions.REGISTRY", registry)
    workflow("unit-batched", batch=Batch(5, 1.0, key="params.t"))(_fn)
    workflow("unit-plain")(_fn)
    assert registry.batch_key("unit-batched") == ("t",)
    assert registry.batch_key("unit-plain") is None
    assert list(registry.batches()) == ["unit-batched"]
    assert registry.flows() == {}  # a batched workflow is not flow-controlled


def test_a_batch_result_gives_every_member_one():
    params = {"key": "", "members": [{"job_id": "a", "params": {}}, {"job_id": "b", "params": {}}]}
    assert batch_result_problem([1, 2], params) is None
    assert batch_result_problem({"a": 1, "b": None}, params) is None
    assert "a list of 1 results for 2 members" in batch_result_problem([1], params)
    assert "missing ['b']" in batch_result_problem({"a": 1}, params)
    assert "not members ['c']" in batch_result_problem({"a": 1, "b": 2, "c": 3}, params)
    assert "int, not a list" in batch_result_problem(3, params)


def test_a_member_with_its_own_start_limit_is_dead_lettered_with_a_reason():
    from onceflow.envelope import JobEnvelope
    from onceflow.vocabulary import DeadLetterReason
    from streams.records import RawRecord, classify
    from workflow_engine.model import WorkflowDef

    registry = Registry()
    registry.add_workflow(WorkflowDef(_fn, "unit-members", "v1", batch=batch_policy(Batch(5, 1))))
    envs = [
        JobEnvelope("m1", "unit-members", {"t": 1}),
        JobEnvelope("m2", "unit-members", {"t": 1}, start_within=30.0),
    ]
    records = [RawRecord("t", 0, i, e.key(), e.encode(), e.headers()) for i, e in enumerate(envs)]
    deliveries, dead = classify(records, 1_000_000, registry)
    assert [(d.envelope.job_id, d.batch_key) for d in deliveries] == [("m1", ())]
    assert [(d.job_id, d.reason) for d in dead] == [("m2", DeadLetterReason.INVALID_START_WITHIN)]
    assert "runs its jobs in batches" in dead[0].detail


def test_ingest_refuses_a_members_own_start_limit_with_a_reason():
    import orjson

    from producers.models import RequestError, parse_submission

    batched = frozenset({"unit-members"})
    ok = orjson.dumps({"workflow": "unit-members", "params": {}})
    assert parse_submission(ok, 10, 1000, batched=batched)[0][0].workflow == "unit-members"
    body = orjson.dumps(
        {
            "jobs": [
                {"workflow": "other", "start_within": 5},
                {"workflow": "unit-members", "start_within": 5},
            ]
        }
    )
    with pytest.raises(RequestError) as refused:
        parse_submission(body, 10, 1000, batched=batched)
    assert refused.value.status == 422
    assert refused.value.body.error == "invalid_start_within"
    assert refused.value.body.fields[0].field == "jobs[1].start_within"


def test_the_formers_pause_has_a_floor():
    """A quarter of the shortest max_wait, but not below 20 ms: a legal max_wait of a
    millisecond made an idle engine probe the database 4,000 times a second."""
    from workflow_engine.clock import SystemClock
    from workflow_engine.engine.batch_former import INTERVAL_SECONDS, BatchFormer

    def pause(wait: float) -> float:
        policy = batch_policy(Batch(max_size=2, max_wait=wait))
        return BatchFormer(None, SystemClock(), {"w": policy}).interval  # type: ignore[arg-type]

    assert pause(0.001) == 0.02  # was 0.00025
    assert pause(0.2) == 0.05
    assert pause(60) == INTERVAL_SECONDS
