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

from onceflow.envelope import MAX_START_DELAY_SECONDS, id_reuse_policy, time_limit
from onceflow.instance_events import MAX_EVENT_TYPE_CHARS  # an awaited type: what may be sent
from onceflow.ticks import Schedule
from onceflow.vocabulary import IdReuse
from workflow_engine.model import (
    Batch,
    BatchPolicy,
    Debounce,
    DebouncePolicy,
    FlowControl,
    RateLimit,
    Registry,
    ScheduleDef,
    Singleton,
    TaskDef,
    TaskFn,
    WebhookSubscription,
    WorkflowDef,
    WorkflowFn,
    batch_policy,
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
    id_reuse: str = "never",
    batch: Batch | None = None,
    debounce: Debounce | None = None,
) -> Callable[[WorkflowFn], WorkflowFn]:
    """Register an async function ``(ctx, params)`` as the workflow called ``name``
    (every option: README, "Flow control" and the sections after it).

    ``version`` names this definition (default: a fingerprint of its source,
    :mod:`workflow_engine.versions`); an instance runs on engines that have it.
    ``schedule``: an instance per tick (a 5-field cron read in ``timezone``, a
    ``timedelta``, or a :class:`~onceflow.ticks.Schedule`). Flow control
    (:class:`~workflow_engine.model.FlowControl`): ``concurrency``, at most
    ``max_per_key`` running per ``concurrency_key`` value (``hold_while_waiting``),
    ``rate_limit``, ``fairness_key``, ``singleton`` (one live instance per key).
    ``webhooks``: endpoints subscribed to its lifecycle events (README, "Webhooks").
    Timing (:func:`_timing`): ``start_after``, ``start_within``, ``execution_timeout``.
    ``batch``: its jobs run in batches (:func:`_check_batch`); ``id_reuse``: may a
    finished job id run again (:func:`_id_reuse`); ``debounce``: of a key's jobs within
    a period only the last (or the first) starts (:func:`_debounce`).
    """
    check_name("workflow name", name)
    timing = _timing(name, start_after, start_within, execution_timeout)
    declared = _declared_schedule(name, schedule, timezone)
    limits = (concurrency, concurrency_key, max_per_key, hold_while_waiting, rate_limit)
    flow = flow_control(*limits, fairness_key, policy := singleton_policy(singleton))
    subscriptions, reuse = _subscriptions(webhooks), _id_reuse(name, id_reuse)
    batched = _check_batch(name, batch_policy(batch), flow, declared, timing[1], reuse)
    extra = (reuse, batched, _debounce(name, debounce, singleton, declared, reuse, batched))

    def register(fn: WorkflowFn) -> WorkflowFn:
        given = check_version(version) if version is not None else fingerprint(fn)
        options = (inline_steps, flow, declared, subscriptions)
        REGISTRY.add_workflow(WorkflowDef(fn, name, given, *options, *timing, policy, *extra))
        return fn

    return register


def _id_reuse(workflow: str, value: str) -> IdReuse:
    """``@workflow(id_reuse=)`` (:class:`~onceflow.vocabulary.IdReuse`), checked when the
    module loads (the envelope's rule): whether a new submission of a job id whose
    instance has finished starts a new run of it: ``never`` (a duplicate, the default),
    ``after_failure`` (after an errored or terminated run), ``after_completion`` (after
    any finished run); the earlier runs are kept, numbered (README, Flow control)."""
    try:
        policy = id_reuse_policy(value)
    except ValueError as exc:
        raise ValueError(f"workflow {workflow!r}: {exc}") from None
    if policy is None:
        raise ValueError(f"workflow {workflow!r}: id_reuse must be named (default 'never')")
    return policy


def _check_batch(
    workflow: str,
    batch: BatchPolicy | None,
    flow: FlowControl | None,
    schedule: ScheduleDef | None,
    start_within: float | None,
    id_reuse: IdReuse,
) -> BatchPolicy | None:
    """A batch declaration (the function is called once per batch with ``{"key": ...,
    "members": [{"job_id": ..., "params": ...}, ...]}`` and returns one result per
    member: a list in member order, or a dict keyed by member job id), refused with what
    makes no sense beside it: flow control and
    singleton policies (they bound the instances the claim starts, and a member is never
    claimed: its batch run is, one per batch), a schedule (a tick is one job on its own),
    a start limit (a member is never started; it is taken into a batch), an id reuse
    policy (a member's outcome is its batch run's: a new run of one member alone would
    be a job no batch takes)."""
    if batch is None:
        return None
    _refuse_clash(
        workflow,
        "batch",
        (
            (
                flow is not None,
                "flow control (concurrency, keys, rate_limit, fairness_key) or a singleton policy",
            ),
            (schedule is not None, "a schedule"),
            (start_within is not None, "start_within"),
            (id_reuse != IdReuse.NEVER, f"id_reuse={id_reuse.value!r}"),
        ),
    )
    return batch


def _refuse_clash(workflow: str, option: str, clashes: Sequence[tuple[bool, str]]) -> None:
    """ValueError naming the first declared option ``option`` cannot be combined with."""
    for declared, what in clashes:
        if declared:
            raise ValueError(f"workflow {workflow!r}: {option} cannot be combined with {what}")


def _debounce(
    workflow: str,
    debounce: Debounce | None,
    singleton: Singleton | None,
    schedule: ScheduleDef | None,
    id_reuse: IdReuse,
    batch: BatchPolicy | None,
) -> DebouncePolicy | None:
    """The checked debounce. Not with a singleton policy or batching (each decides, when
    a job of a key is created, what becomes of it: their answers would contradict each
    other), nor with a schedule (its ticks are not debounced: they have their own overlap
    policy, and a declared debounce would not hold for them), nor with an id reuse policy
    (a new run of a finished id is not a creation the debounce sees)."""
    policy = debounce_policy(debounce)
    if policy is None:
        return None
    _refuse_clash(
        workflow,
        "debounce",
        (
            (singleton is not None, "singleton"),
            (schedule is not None, "a schedule"),
            (batch is not None, "batch"),
            (id_reuse != IdReuse.NEVER, f"id_reuse={id_reuse.value!r}"),
        ),
    )
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
