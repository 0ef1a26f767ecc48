"""Debounce as declared (``@workflow(debounce=...)``): checked when the module loads, and
what creating an instance decides on."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from onceflow.vocabulary import DebounceMode, InstanceStatus, LifecycleEvent
from workflow_engine import Debounce, Singleton, workflow
from workflow_engine.model import Batch, DebouncePolicy, Registry, WorkflowDef, debounce_policy


async def _fn(ctx, params):
    return None


def test_a_trailing_debounce_in_seconds():
    policy = debounce_policy(Debounce("params.tenant.id", 5, max_wait=timedelta(minutes=1)))
    assert policy == DebouncePolicy(("tenant", "id"), 5.0, 60.0, DebounceMode.TRAILING)


def test_a_leading_debounce_and_no_max_wait():
    assert debounce_policy(Debounce("params.k", timedelta(seconds=2), mode="leading")) == (
        DebouncePolicy(("k",), 2.0, None, DebounceMode.LEADING)
    )
    assert debounce_policy(Debounce("params.k", 1.0)).max_wait is None  # trailing, unbounded
    assert debounce_policy(None) is None


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (Debounce("tenant", 1.0), "dotted path on params"),
        (Debounce("params.k", 0), "above 0"),
        (Debounce("params.k", -1.0), "above 0"),
        (Debounce("params.k", float("nan")), "above 0"),
        (Debounce("params.k", float("inf")), "above 0"),
        (Debounce("params.k", 5.0, max_wait=4.0), "at least its period"),
        (Debounce("params.k", 5.0, max_wait=10.0, mode="leading"), "no meaning with mode"),
        (Debounce("params.k", 5.0, mode="throttle"), "not one of trailing, leading"),
        # what the creating transaction cannot add to a timestamp (PostgreSQL refused
        # every job of the workflow at run time: interval / timestamp out of range)
        (Debounce("params.k", 5.0, max_wait=float("inf")), "max_wait .* at most"),
        (Debounce("params.k", 5.0, max_wait=timedelta.max), "max_wait .* at most"),
        (Debounce("params.k", 1e15), "period .* at most"),
        (Debounce("params.k", 366 * 86400.0, mode="leading"), "period .* at most"),
    ],
)
def test_a_bad_declaration_fails_at_registration(bad, says):
    with pytest.raises(ValueError, match=says):
        debounce_policy(bad)


def test_max_wait_equal_to_the_period_is_allowed():
    assert debounce_policy(Debounce("params.k", 5.0, max_wait=5.0)).max_wait == 5.0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            {"singleton": Singleton("params.k", "skip")},
            "debounce cannot be combined with singleton",
        ),
        ({"schedule": "*/5 * * * *"}, "debounce cannot be combined with a schedule"),
        ({"debounce": Debounce("params.k", 0)}, "above 0"),
    ],
)
def test_the_decorator_refuses_when_the_module_loads(options, says):
    options = {"debounce": Debounce("params.k", 1.0), **options}
    with pytest.raises(ValueError, match=says):
        workflow("t-debounce-bad", **options)


def test_the_registry_hands_the_policy_to_the_create_path():
    policy = debounce_policy(Debounce("params.k", 1.0))
    registry = Registry()
    registry.add_workflow(WorkflowDef(_fn, "w", "v1", debounce=policy))
    assert registry.debounce("w") == policy
    assert registry.debounce("other") is None
    registry.add_workflow(WorkflowDef(_fn, "plain", "v1"))
    assert registry.debounce("plain") is None


def test_debounced_is_final():
    assert InstanceStatus.DEBOUNCED.terminal and not InstanceStatus.DEBOUNCED.runnable
    assert LifecycleEvent.DEBOUNCED.final


@pytest.mark.parametrize(
    ("options", "clash"),
    [
        ({"batch": Batch(max_size=5, max_wait=1.0)}, "batch"),
        ({"id_reuse": "after_failure"}, "id_reuse='after_failure'"),
    ],
)
def test_a_debounce_beside_batching_or_id_reuse_fails_when_the_module_loads(options, clash):
    """Each decides what becomes of a key's new job (batching), or makes a creation the
    debounce never sees (a new run of a finished id)."""
    with pytest.raises(ValueError, match=f"debounce cannot be combined with {re.escape(clash)}"):
        workflow("test-debounce-clash", debounce=Debounce("params.k", 1.0), **options)


def test_batching_beside_id_reuse_fails_when_the_module_loads():
    with pytest.raises(
        ValueError, match="batch cannot be combined with id_reuse='after_completion'"
    ):
        workflow(
            "test-batch-clash", batch=Batch(max_size=5, max_wait=1.0), id_reuse="after_completion"
        )
