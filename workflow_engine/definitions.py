"""Defining workflows: the ``@workflow`` and ``@task`` decorators, the registry they
fill (:class:`~workflow_engine.model.Registry`) and retry policies.

from workflow_engine import workflow

@workflow("order-workflow")
async def order(ctx, params):
    receipt = await ctx.step("charge payment", charge, params["amount"])
    await ctx.step("ship", ship, receipt["id"])
    return {"receipt": receipt["id"]}
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from onceflow.envelope import MAX_START_DELAY_SECONDS, time_limit
from onceflow.instance_events import MAX_EVENT_TYPE_CHARS  # an awaited type: what may be sent
from onceflow.ticks import Schedule
from workflow_engine.model import (
    Debounce,
    DebouncePolicy,
    RateLimit,
    Registry,
    ScheduleDef,
    Singleton,
    TaskDef,
    TaskFn,
    WebhookSubscription,
    WorkflowDef,
    WorkflowFn,
    debounce_policy,
    flow_control,
    singleton_policy,
)
from workflow_engine.versions import check_version, fingerprint


@dataclass(frozen=True, slots=True)
class ChildHandle:
    """What ``ctx.start_child`` answers and ``ctx.child_result`` takes: the child's job
    id, and the position of its entry in the parent's history."""

    job_id: str
    name: str
    workflow: str
    position: int


class Context(Protocol):
    """What a workflow function may ask of its ``ctx`` (the engine's
    :class:`~workflow_engine.engine.context.WorkflowContext` implements it). Declared
    here, with the definitions, so workflow code and this module never import the
    engine runtime."""

    job_id: str
    workflow: str

    def idempotency_key(self, step_name: str) -> str: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retries: RetryPolicy | None = None,
        timeout: float | None = None,
        inline: bool | None = None,
        **kwargs: Any,
    ) -> Any: ...

    async def sleep(self, name: str, duration: float | timedelta) -> None: ...

    async def sleep_until(self, name: str, when: datetime) -> None: ...

    async def wait_for_event(
        self, name: str, type: str, timeout: float | timedelta | None = None
    ) -> Any: ...

    async def patched(self, patch_id: str) -> bool: ...

    async def deprecate_patch(self, patch_id: str) -> None: ...

    async def set_attributes(self, update: dict[str, Any]) -> None: ...

    async def start_child(
        self,
        workflow: str,
        name: str,
        params: dict[str, Any] | None = None,
        on_parent_close: Literal["terminate", "abandon"] = "terminate",
    ) -> ChildHandle: ...

    async def child_result(self, handle: ChildHandle) -> Any: ...

    async def gather(self, *branches: Awaitable[Any]) -> Sequence[Any]: ...


# --- bounds on names: every one of them reaches an index ------------------------------
#
# A B-tree entry holds at most ~2.7 kB; a longer value fails its insert (SQLSTATE
# 54000). So names are bounded where they enter: a workflow's or task's at registration,
# a step's (or sleep's, event wait's, patch's, child's) when the workflow asks for it,
# which fails that instance with the reason instead of a write batch in the database.

#: A workflow's or task's name: what the ingest API accepts in ``workflow``.
MAX_TYPE_NAME_CHARS = 100
#: A step's name, indexed with the job id (``onceflow_steps_name_key``): 500 characters
#: are at most 2,000 bytes of UTF-8.
MAX_STEP_NAME_CHARS = 500


def check_name(what: str, name: str) -> str:
    """``name`` if it is short enough for a ``what`` ("workflow name", "task name",
    "step name", "sleep name", "event type"...), else ValueError saying so."""
    limit = MAX_STEP_NAME_CHARS
    if what in ("workflow name", "task name"):
        limit = MAX_TYPE_NAME_CHARS
    elif what == "event type":
        limit = MAX_EVENT_TYPE_CHARS
    if len(name) > limit:
        raise ValueError(
            f"{what} {name[:40]!r}... is {len(name)} characters, over the limit of {limit}"
            " (names are indexed, and an index entry holds at most ~2.7 kB)"
        )
    return name


#: The registry the decorators fill: the workflow modules a process loads
#: (``ONCEFLOW_WORKFLOW_MODULES``) register here, and the process hands it on.
REGISTRY = Registry()


def workflow(
    name: str,
    concurrency: int | None = None,
    version: str | None = None,
    schedule: str | timedelta | Schedule | None = None,
    timezone: str = "UTC",
    *,
    concurrency_key: str | None = None,
    max_per_key: int | None = None,
    hold_while_waiting: bool = False,
    rate_limit: RateLimit | None = None,
    fairness_key: str | None = None,
    inline_steps: bool = False,
    webhooks: Sequence[str | WebhookSubscription] = (),
    start_after: float | timedelta | None = None,
    start_within: float | timedelta | None = None,
    execution_timeout: float | timedelta | None = None,
    singleton: Singleton | None = None,
    debounce: Debounce | None = None,
) -> Callable[[WorkflowFn], WorkflowFn]:
    """Register an async function ``(ctx, params)`` as the workflow called ``name``.

    ``concurrency`` caps how many of its instances run at once across all engines;
    the rest stay queued. Sleeping and waiting instances do not count.

    ``version`` names this definition (``"2026-11-30"``); without it, the version is a
    fingerprint of the function's source (:mod:`workflow_engine.versions`); an instance
    runs only on engines that have the version it was created with.

    ``schedule`` starts an instance per tick: a 5-field cron expression read in
    ``timezone``, a ``timedelta``, or a :class:`~onceflow.ticks.Schedule` (README,
    "Schedules"), which engines upsert at start.

    Flow control (:class:`~workflow_engine.model.FlowControl`, README "Flow control"): at
    most ``max_per_key`` (default 1) running per value of ``concurrency_key`` (a params
    path, ``"params.customer_id"``; sleeping and waiting ones keep their slot only with
    ``hold_while_waiting``); ``rate_limit`` starts per period per key; claims round-robin
    across ``fairness_key``'s values; ``singleton``: one live instance per key;
    ``debounce``: of a key's jobs within a period only the last (or the first) starts
    (:class:`~workflow_engine.model.Singleton`, :class:`~workflow_engine.model.Debounce`).

    ``webhooks`` subscribes endpoints (names from ``ONCEFLOW_WEBHOOK_ENDPOINTS``) to its
    lifecycle events: a name gets the endpoint's kinds (by default the final ones), a
    :class:`~workflow_engine.model.WebhookSubscription` the kinds it names (README,
    "Webhooks"; an unknown name stops the engine at start). Timing: :func:`_timing`.
    """
    check_name("workflow name", name)
    timing = _timing(name, start_after, start_within, execution_timeout)
    declared = _declared_schedule(name, schedule, timezone)
    limits = (concurrency, concurrency_key, max_per_key, hold_while_waiting, rate_limit)
    flow = flow_control(*limits, fairness_key, policy := singleton_policy(singleton))
    options = (inline_steps, flow, declared, _subscriptions(webhooks))
    debounced = _debounce(name, debounce, singleton, declared)

    def register(fn: WorkflowFn) -> WorkflowFn:
        given = check_version(version) if version is not None else fingerprint(fn)
        REGISTRY.add_workflow(WorkflowDef(fn, name, given, *options, *timing, policy, debounced))
        return fn

    return register


def _debounce(
    workflow: str,
    debounce: Debounce | None,
    singleton: Singleton | None,
    schedule: ScheduleDef | None,
) -> DebouncePolicy | None:
    """The checked debounce. Not with a singleton policy (both decide, when a job of a key
    is created, which one of the key runs: their answers would contradict each other)
    nor with a schedule (its ticks are not debounced: they have their own overlap
    policy, and a declared debounce would not hold for them)."""
    policy = debounce_policy(debounce)
    if policy is not None and singleton is not None:
        raise ValueError(f"workflow {workflow!r}: debounce cannot be combined with singleton")
    if policy is not None and schedule is not None:
        raise ValueError(f"workflow {workflow!r}: debounce cannot be combined with a schedule")
    return policy


def _subscriptions(
    webhooks: Sequence[str | WebhookSubscription],
) -> tuple[WebhookSubscription, ...]:
    """``@workflow(webhooks=...)``: an endpoint's name is a subscription to its kinds."""
    return tuple(
        w if isinstance(w, WebhookSubscription) else WebhookSubscription(w) for w in webhooks
    )


def _timing(
    workflow: str,
    start_after: float | timedelta | None,
    start_within: float | timedelta | None,
    execution_timeout: float | timedelta | None,
) -> tuple[float | None, float | None, float | None]:
    """``@workflow``'s timing in seconds (each seconds or a ``timedelta``, at most a year),
    checked when the module loads. ``start_after``: a new instance becomes claimable that
    long after its job was submitted, unless the job gives its own (README, "Delayed
    start"). Time limits (README, "Time limits"; more than 0): ``start_within``, an
    instance not first started that long after its start time is errored
    ``start_timeout`` instead of run (a job's own ``start_within`` overrides it);
    ``execution_timeout``, one still running that long after its first start is errored
    ``timed_out`` at its next step boundary, or then if it sleeps or waits (running step
    code is not interrupted)."""
    return (
        _start_delay(workflow, start_after),
        _time_limit(workflow, "start_within", start_within),
        _time_limit(workflow, "execution_timeout", execution_timeout),
    )


def _start_delay(workflow: str, start_after: float | timedelta | None) -> float | None:
    """The declared default delay in seconds, checked when the module loads."""
    if start_after is None:
        return None
    seconds = start_after.total_seconds() if isinstance(start_after, timedelta) else start_after
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"workflow {workflow!r}: start_after must be seconds or a timedelta")
    if not 0 <= seconds <= MAX_START_DELAY_SECONDS:
        raise ValueError(
            f"workflow {workflow!r}: start_after={seconds!r} is outside"
            f" 0..{MAX_START_DELAY_SECONDS} seconds (a year)"
        )
    return float(seconds) or None


def _time_limit(workflow: str, option: str, limit: float | timedelta | None) -> float | None:
    """A declared time limit in seconds, checked when the module loads by the envelope's
    rule (:func:`onceflow.envelope.time_limit`: more than 0, at most a year)."""
    seconds = limit.total_seconds() if isinstance(limit, timedelta) else limit
    try:
        return time_limit(option, seconds)
    except ValueError as exc:
        raise ValueError(f"workflow {workflow!r}: {exc}") from None


def _declared_schedule(
    workflow: str, schedule: str | timedelta | Schedule | None, timezone: str
) -> ScheduleDef | None:
    """Check a declared schedule at import time, so a typo fails loudly and early."""
    if schedule is None:
        return None
    s = schedule if isinstance(schedule, Schedule) else Schedule(schedule, timezone)
    return ScheduleDef(
        s.name or workflow, workflow, s.spec, s.params, s.catchup, s.overlap, s.max_catchup
    )


def task(name: str, max_retries: int = 3, delay: float = 1.0) -> Callable[[TaskFn], TaskFn]:
    """Register a single-step job, run by the streams worker without a workflow.

    The handler gets the job's params. A failure is retried ``max_retries`` times,
    ``delay`` seconds apart; then the record goes to the dead-letter topic.
    """
    check_name("task name", name)

    def register(fn: TaskFn) -> TaskFn:
        REGISTRY.add_task(TaskDef(name, fn, max_retries, delay))
        return fn

    return register


def registered_tasks() -> list[str]:
    return REGISTRY.task_names()


def registered_workflows() -> list[str]:
    return REGISTRY.workflow_names()


def registered_versions() -> dict[str, str]:
    """The version of every registered workflow: what this process can run."""
    return REGISTRY.versions()


def load_workflow_modules(modules: Iterable[str]) -> Registry:
    """Import the modules that define workflows (``ONCEFLOW_WORKFLOW_MODULES``); the
    registry they filled."""
    for module in modules:
        importlib.import_module(module)
    return REGISTRY


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing step is retried. Defaults follow Cloudflare Workflows.

    ``delay_fn``, when given, computes the delay from the error and the attempt number
    (1-based) and overrides ``delay``/``backoff``; return ``None`` to use them.
    """

    limit: int = 5
    delay: float = 10.0
    backoff: Literal["constant", "linear", "exponential"] = "exponential"
    max_delay: float = 3600.0
    delay_fn: Callable[[BaseException, int], float | None] | None = None

    def delay_for(self, error: BaseException, attempt: int) -> float:
        if self.delay_fn is not None:
            custom = self.delay_fn(error, attempt)
            if custom is not None:
                return max(0.0, float(custom))
        if self.backoff == "constant":
            value = self.delay
        elif self.backoff == "linear":
            value = self.delay * attempt
        else:
            value = self.delay * (2 ** (attempt - 1))
        return min(value, self.max_delay)


DEFAULT_RETRY = RetryPolicy()
