"""Singleton policies as declared (``@workflow(singleton=...)``): checked when the module
loads, mapped onto the claim's per-key limit, and what creating an instance decides on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from onceflow.vocabulary import InstanceStatus, SingletonMode
from workflow_engine import Singleton
from workflow_engine.model import (
    FlowControl,
    RateLimit,
    Registry,
    WorkflowDef,
    flow_control,
    singleton_policy,
)
from workflow_engine.store.views.describe import InstanceView


async def _fn(ctx, params):
    return None


def _registry(name: str, singleton: Singleton, **flow) -> Registry:
    policy = singleton_policy(singleton)
    registry = Registry()
    registry.add_workflow(
        WorkflowDef(_fn, name, "v1", flow=flow_control(singleton=policy, **flow), singleton=policy)
    )
    return registry


@pytest.mark.parametrize(
    ("mode", "stored"),
    [
        ("skip", SingletonMode.SKIP),
        ("cancel_in_progress", SingletonMode.CANCEL_IN_PROGRESS),
        ("cancel_newest", SingletonMode.SKIP),
        ("queue", SingletonMode.QUEUE),
    ],
)
def test_a_singleton_is_a_per_key_limit_of_one_held_while_waiting(mode, stored):
    flow = flow_control(singleton=singleton_policy(Singleton("params.customer.id", mode)))
    assert flow == FlowControl(
        concurrency_key=("customer", "id"),
        max_per_key=1,
        hold_while_waiting=True,
        singleton=stored,
    )
    assert flow.lane == ("customer", "id")
    assert flow.spec()["singleton"] == str(flow.singleton)


def test_cancel_newest_is_skip_under_hatchets_name():
    assert singleton_policy(Singleton("params.k", "cancel_newest")).mode == SingletonMode.SKIP
    assert singleton_policy(Singleton("params.k", SingletonMode.SKIP)).mode == SingletonMode.SKIP


@pytest.mark.parametrize(
    "flow",
    [
        {"concurrency_key": "params.customer"},
        {"concurrency_key": "params.customer", "max_per_key": 2},
        {"max_per_key": 1},
        {"hold_while_waiting": True},
    ],
)
def test_another_per_key_limit_with_a_singleton_is_an_error(flow):
    with pytest.raises(ValueError, match="singleton is a per-key limit of its own"):
        flow_control(singleton=singleton_policy(Singleton("params.k", "skip")), **flow)


def test_a_workflow_limit_a_rate_limit_and_fairness_combine_with_a_singleton():
    flow = flow_control(
        concurrency=3,
        rate_limit=RateLimit(5),
        fairness_key="params.tenant",
        singleton=singleton_policy(Singleton("params.k", "skip")),
    )
    assert flow is not None
    assert (flow.concurrency, flow.rate_limit, flow.lane) == (3, 5, ("tenant",))


@pytest.mark.parametrize("bad", [Singleton("customer"), Singleton("params.k", "drop")])
def test_a_bad_key_or_mode_fails_at_registration(bad):
    with pytest.raises(ValueError):
        singleton_policy(bad)


def test_the_decorator_refuses_a_bad_combination_when_the_module_loads():
    from workflow_engine import workflow

    with pytest.raises(ValueError, match="singleton"):
        workflow(
            "t-singleton-bad",
            concurrency_key="params.k",
            singleton=Singleton("params.k", "skip"),
        )


def test_only_deciding_modes_reach_the_create_path():
    assert _registry("w", Singleton("params.k", "skip")).singleton("w").mode == SingletonMode.SKIP
    cancel = _registry("w", Singleton("params.k", "cancel_in_progress")).singleton("w")
    assert cancel.mode == SingletonMode.CANCEL_IN_PROGRESS and cancel.key == ("k",)
    assert _registry("w", Singleton("params.k", "queue")).singleton("w") is None
    assert Registry().singleton("w") is None


@pytest.mark.parametrize(
    ("status", "note"),
    [
        ("terminated", "cancelled by new_1, a newer instance of key 'c1'"),
        ("running", "being cancelled (at its next step) by new_1, a newer instance of key 'c1'"),
        # its last step finished before the engine saw the request: it completed
        (
            "complete",
            "complete before its cancellation took effect; superseded by new_1,"
            " a newer instance of key 'c1'",
        ),
    ],
)
def test_the_note_of_a_superseded_instance_says_how_far_the_cancellation_got(status, note):
    view = InstanceView(
        *("old_1", "w", InstanceStatus(status), {}, datetime.now(UTC), None, None, None, None),
        *(None, None, "http", 0, 0, 0, 0, []),
        singleton_key="c1",
        cancelled_by="new_1",
    )
    assert view.singleton_note == note


def test_an_instance_takes_the_policy_of_the_delivery_that_created_it_only():
    """Found in review: an id first delivered naming a plain workflow (it created the
    instance) and again in the batch naming a singleton one took the singleton's policy:
    its row got a key and a decision although the later record is only a duplicate."""
    from onceflow.envelope import JobEnvelope
    from workflow_engine.model import Delivery
    from workflow_engine.store.writes.singleton import _policies

    skip = _registry("s", Singleton("params.k", "skip")).singleton("s")
    plain_first = Delivery(JobEnvelope("j1", "plain", {"k": "a"}), "t", 0, 0)
    singleton_later = Delivery(JobEnvelope("j1", "s", {"k": "a"}), "t", 0, 1, singleton=skip)
    singleton_first = Delivery(JobEnvelope("j2", "s", {"k": "b"}), "t", 0, 2, singleton=skip)
    found = _policies([plain_first, singleton_later, singleton_first], {"j1", "j2"})
    assert found == {"j2": skip}
