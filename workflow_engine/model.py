"""The domain model: what a workflow, a task, a schedule and a delivery are.

Plain frozen values, no SQL and no I/O: the definitions fill a :class:`Registry` of
them, the processes are handed that registry (the engine runner, the worker's batch
handler, ingest), and the store takes and returns these types. The store imports this
module; nothing here imports the store (a contract in ``pyproject.toml`` says so).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from onceflow.envelope import MAX_START_DELAY_SECONDS, JobEnvelope
from onceflow.errors import ConfigurationError, OnceflowError
from onceflow.ticks import TickSpec, check_name
from onceflow.vocabulary import (
    CatchupPolicy,
    DebounceMode,
    IdReuse,
    JobKind,
    Origin,
    OverlapPolicy,
    SingletonMode,
    StepKind,
    StepStatus,
)
from onceflow.webhooks import callback_problem, check_kinds

# --- flow control ---------------------------------------------------------------------

#: Key paths: the keys under ``params`` (``params.customer.id`` -> ``("customer", "id")``);
#: a number selects an array element. The value is compared as text (``#>>``).
KeyPath = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FlowControl:
    """What the engine enforces when it claims one workflow's instances: its
    concurrency limit, per-key limits, rate limit and fairness (README, "Flow control").
    The one place a workflow's concurrency limit lives."""

    concurrency: int | None = None  # running instances of the workflow, all keys
    concurrency_key: KeyPath | None = None
    max_per_key: int = 1
    hold_while_waiting: bool = False  # sleeping/waiting instances keep their slot
    rate_limit: int | None = None  # instance starts per period per rate key
    rate_period: float = 1.0  # seconds
    rate_key: KeyPath | None = None  # None: one bucket for the whole workflow
    fairness_key: KeyPath | None = None
    # Set when a singleton policy declared the per-key limit (concurrency_key, one per
    # key, held while waiting): recorded in the spec (onceflow_flow_controls).
    singleton: SingletonMode | None = None

    @property
    def lane(self) -> KeyPath | None:
        """The key an instance's ``flow_lane`` is taken from when it is created."""
        return self.fairness_key or self.concurrency_key or self.rate_key

    @property
    def limit_keys(self) -> list[KeyPath]:
        """The keys that hold instances back: the concurrency key, the rate key."""
        rate = self.rate_key if self.rate_limit is not None else None
        return [key for key in (self.concurrency_key, rate) if key is not None]

    def spec(self) -> dict[str, Any]:
        """As stored in ``onceflow_flow_controls`` (read by ``onceflow_hold_reason``)."""
        doc: dict[str, Any] = {}
        if self.concurrency is not None:
            doc["concurrency"] = self.concurrency
        if self.concurrency_key is not None:
            doc["concurrency_key"] = list(self.concurrency_key)
            doc["max_per_key"] = self.max_per_key
            doc["hold_while_waiting"] = self.hold_while_waiting
        if self.rate_limit is not None:
            doc["rate_limit"] = self.rate_limit
            doc["rate_period"] = self.rate_period
            doc["rate_key"] = list(self.rate_key) if self.rate_key is not None else None
        if self.fairness_key is not None:
            doc["fairness_key"] = list(self.fairness_key)
        if self.singleton is not None:
            doc["singleton"] = str(self.singleton)
        return doc


@dataclass(frozen=True)
class Singleton:
    """``@workflow(singleton=Singleton(key="params.customer", mode="skip"))``: at most
    one live instance per value of ``key`` (a dotted path on params, like
    ``concurrency_key``; for the decision a missing key is the key ``''``). ``mode``
    says what a new instance does while another of its key is live (queued, running,
    sleeping, waiting or paused): ``queue`` waits its turn, ``skip`` (alias
    ``cancel_newest``) is recorded skipped naming the live one, ``cancel_in_progress``
    terminates the live ones and runs (README, "Flow control")."""

    key: str
    mode: SingletonMode | str = SingletonMode.QUEUE


@dataclass(frozen=True, slots=True)
class SingletonPolicy:
    """A singleton policy as checked at registration: what the creating transaction
    decides on (``skip`` or ``cancel_in_progress``; ``queue`` needs no decision)."""

    key: KeyPath
    mode: SingletonMode

    @property
    def decides(self) -> bool:
        """Whether creating an instance takes a decision (``queue`` only waits)."""
        return self.mode != SingletonMode.QUEUE


def singleton_policy(singleton: Singleton | None) -> SingletonPolicy | None:
    """The checked policy (ValueError on an unknown mode or a bad key path);
    ``cancel_newest`` is ``skip`` under Hatchet's name."""
    if singleton is None:
        return None
    try:
        mode = SingletonMode(singleton.mode)
    except ValueError:
        modes = ", ".join(m.value for m in SingletonMode)
        raise ValueError(f"singleton mode {singleton.mode!r} is not one of {modes}") from None
    if mode == SingletonMode.CANCEL_NEWEST:
        mode = SingletonMode.SKIP
    return SingletonPolicy(key_path(singleton.key), mode)


@dataclass(frozen=True)
class Batch:
    """``@workflow(batch=Batch(max_size=100, max_wait=2.0, key="params.tenant"))``: the
    workflow's jobs are run in batches, one run taking the params of up to ``max_size``
    jobs of one value of ``key`` (a dotted path on params; None: one pool for the
    workflow; a missing key is the key ``''``). A batch is formed when ``max_size`` jobs
    wait, or when the oldest has waited ``max_wait`` (seconds or a ``timedelta``). Each
    job keeps its own instance, status and result (README, "Flow control")."""

    max_size: int
    max_wait: float | timedelta
    key: str | None = None


#: The largest batch: a batch run's params hold every member's, in one jsonb value.
MAX_BATCH_SIZE = 1000


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """A batch declaration as checked at registration."""

    max_size: int
    max_wait: float  # seconds
    key: KeyPath  # () : one pool for the whole workflow


def batch_policy(batch: Batch | None) -> BatchPolicy | None:
    """The checked policy: ValueError unless 2 <= max_size <= MAX_BATCH_SIZE and
    0 < max_wait <= a day, or on a bad key path."""
    if batch is None:
        return None
    size = batch.max_size
    if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= MAX_BATCH_SIZE:
        raise ValueError(
            f"batch max_size must be an integer from 2 to {MAX_BATCH_SIZE}, not {size!r}"
        )
    wait = (
        batch.max_wait.total_seconds() if isinstance(batch.max_wait, timedelta) else batch.max_wait
    )
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 < wait <= 86400:
        raise ValueError(
            f"batch max_wait must be more than 0 and at most a day (seconds), not {wait!r}"
        )
    return BatchPolicy(size, float(wait), key_path(batch.key) if batch.key else ())


def batch_result_problem(value: Any, params: Mapping[str, Any]) -> str | None:
    """Why a batch run's return value does not give every member a result, or None: it
    must be a list with one element per member, in member order, or a dict whose keys
    are exactly the members' job ids (``params``: the run's, ``batches.batch_params``)."""
    members = [m["job_id"] for m in params.get("members", ())]
    if isinstance(value, list | tuple):
        if len(value) == len(members):
            return None
        return (
            f"batch result: a list of {len(value)} results for {len(members)} members"
            " (one per member, in member order)"
        )
    if isinstance(value, dict):
        missing = [m for m in members if m not in value]
        extra = [k for k in value if k not in set(members)]
        if not missing and not extra:
            return None
        return (
            f"batch result: a dict keyed by member job id, missing {missing[:3]}"
            f" ({len(missing)}), not members {extra[:3]} ({len(extra)})"
        )
    return (
        f"batch result: {type(value).__name__}, not a list with one result per member"
        " or a dict keyed by member job id"
    )


@dataclass(frozen=True, slots=True)
class Debounce:
    """``@workflow(debounce=Debounce(key="params.tenant", period=5.0))``: of the jobs of
    one value of ``key`` (a dotted path on params; a missing key is the key ``''``) that
    come within ``period`` seconds of each other, only one starts: the last
    (``mode="trailing"``, the default: each new job takes the place of the one waiting,
    which is recorded ``debounced``, and starts ``period`` after it came, but no later
    than ``max_wait`` after its window's first job) or the first (``"leading"``: it
    starts at once; the others within ``period`` of it are recorded ``debounced``).
    README, "Flow control"."""

    key: str
    period: timedelta | float
    max_wait: timedelta | float | None = None  # trailing only; None: no bound
    mode: DebounceMode | str = DebounceMode.TRAILING


@dataclass(frozen=True, slots=True)
class DebouncePolicy:
    """A debounce as checked at registration (seconds)."""

    key: KeyPath
    period: float
    max_wait: float | None
    mode: DebounceMode


def _seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


#: The longest debounce period or max_wait: a year, as a delayed start's (the creating
#: transaction adds them to timestamps, which PostgreSQL bounds).
MAX_DEBOUNCE_SECONDS = MAX_START_DELAY_SECONDS


def debounce_policy(debounce: Debounce | None) -> DebouncePolicy | None:
    """The checked debounce (ValueError: a bad key path or mode, a period not above 0,
    a period or max_wait over a year, a max_wait below the period or given with
    ``leading``, where the leader starts at once and nothing waits)."""
    if debounce is None:
        return None
    try:
        mode = DebounceMode(debounce.mode)
    except ValueError:
        modes = ", ".join(m.value for m in DebounceMode)
        raise ValueError(f"debounce mode {debounce.mode!r} is not one of {modes}") from None
    period = _seconds(debounce.period)
    if not period > 0 or period == float("inf"):
        raise ValueError(f"debounce period must be a number of seconds above 0: {period}")
    wait = None if debounce.max_wait is None else _seconds(debounce.max_wait)
    for name, value in (("period", period), ("max_wait", wait)):
        if value is not None and not value <= MAX_DEBOUNCE_SECONDS:
            raise ValueError(
                f"debounce {name} ({value} s) must be at most {MAX_DEBOUNCE_SECONDS} s (a year)"
            )
    if wait is not None and mode == DebounceMode.LEADING:
        raise ValueError("debounce max_wait has no meaning with mode 'leading' (it starts at once)")
    if wait is not None and not wait >= period:
        raise ValueError(f"debounce max_wait ({wait} s) must be at least its period ({period} s)")
    return DebouncePolicy(key_path(debounce.key), period, wait, mode)


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` instance starts per ``period`` per value of ``key`` (a dotted
    path on params; None: one budget for the whole workflow). A start is an instance's
    first claim (again after a restart); resuming after a sleep, an event or a crash is
    not a start. Instances over the limit wait, queued; none is dropped. The window
    slides: no interval of ``period`` holds more than ``limit`` starts."""

    limit: int
    period: timedelta | float = timedelta(seconds=1)
    key: str | None = None

    @property
    def seconds(self) -> float:
        period = self.period
        return period.total_seconds() if isinstance(period, timedelta) else float(period)


def key_path(expression: str) -> KeyPath:
    """``"params.customer.id"`` -> ``("customer", "id")``. A key is a dotted path on the
    job's params (a number selects an array element); its value is compared as text,
    and a missing key is one key of its own (null)."""
    parts = expression.split(".")
    if len(parts) < 2 or parts[0] != "params" or not all(parts[1:]):
        raise ValueError(f"a key is a dotted path on params, like 'params.tenant': {expression!r}")
    return tuple(parts[1:])


def flow_control(
    concurrency: int | None = None,
    concurrency_key: str | None = None,
    max_per_key: int | None = None,
    hold_while_waiting: bool = False,
    rate_limit: RateLimit | None = None,
    fairness_key: str | None = None,
    singleton: SingletonPolicy | None = None,
) -> FlowControl | None:
    """The flow control ``@workflow``'s arguments declare, checked (ValueError); None
    when they declare none. A singleton policy is a per-key limit of one on its key,
    held while sleeping or waiting, so it cannot be combined with another per-key
    limit (``concurrency_key``, ``max_per_key``, ``hold_while_waiting``)."""
    if singleton is not None:
        if concurrency_key is not None or max_per_key is not None or hold_while_waiting:
            raise ValueError(
                "singleton is a per-key limit of its own (one per key, held while waiting):"
                " it cannot be combined with concurrency_key, max_per_key or"
                " hold_while_waiting"
            )
        concurrency_key = "params." + ".".join(singleton.key)
        max_per_key, hold_while_waiting = 1, True
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if (max_per_key is not None or hold_while_waiting) and concurrency_key is None:
        raise ValueError("max_per_key and hold_while_waiting need a concurrency_key")
    per_key = 1 if max_per_key is None else max_per_key
    if per_key < 1:
        raise ValueError("max_per_key must be at least 1")
    if rate_limit is not None and (rate_limit.limit < 1 or rate_limit.seconds <= 0):
        raise ValueError("a rate limit needs limit >= 1 and a positive period")
    flow = FlowControl(
        concurrency=concurrency,
        concurrency_key=key_path(concurrency_key) if concurrency_key else None,
        max_per_key=per_key,
        hold_while_waiting=hold_while_waiting,
        rate_limit=rate_limit.limit if rate_limit else None,
        rate_period=rate_limit.seconds if rate_limit else 1.0,
        rate_key=key_path(rate_limit.key) if rate_limit and rate_limit.key else None,
        fairness_key=key_path(fairness_key) if fairness_key else None,
        singleton=singleton.mode if singleton is not None else None,
    )
    return None if flow == FlowControl() else flow


# --- schedules ------------------------------------------------------------------------


class ScheduleError(OnceflowError):
    """A schedule operation that cannot be done."""


@dataclass(frozen=True)
class ScheduleDef:
    """A schedule as declared (``@workflow(schedule=...)``) or created (CLI, API)."""

    name: str
    workflow: str
    spec: TickSpec
    params: Mapping[str, Any] = field(default_factory=dict)
    catchup: CatchupPolicy = CatchupPolicy.RUN_ONCE
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    max_catchup: int = 100

    def __post_init__(self) -> None:
        check_name(self.name)
        if not 1 <= self.max_catchup <= 1000:
            raise ScheduleError("max_catchup must be between 1 and 1000")
        try:  # plain strings ("run-all") are welcome; unknown words fail here, early
            object.__setattr__(self, "catchup", CatchupPolicy(self.catchup))
            object.__setattr__(self, "overlap", OverlapPolicy(self.overlap))
        except ValueError as exc:
            raise ScheduleError(str(exc)) from None


# --- what the create path takes and answers ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    """One consumed Kafka record carrying a valid job envelope."""

    envelope: JobEnvelope
    topic: str
    partition: int
    offset: int
    kind: JobKind = JobKind.WORKFLOW  # or TASK: a single-step job run by the streams worker
    enqueued_at: datetime | None = None  # the Kafka record's timestamp
    # The workflow definition's version in the creating process (the streams worker
    # loads the same workflow modules as the engines); the instance keeps it for life.
    version: str | None = None
    # Provenance when not the envelope's own (http/kafka): a schedule's tick.
    origin: Origin | None = None
    # The params key whose value becomes the instance's fairness lane (flow control:
    # Registry.lane_path); () for flow control without a key (lane ''); None: no flow
    # control (no lane).
    lane_path: KeyPath | None = None
    # The workflow's default delayed start in seconds (``@workflow(start_after=)``),
    # applied when the job gives no ``run_at``/``start_after`` of its own.
    start_after: float | None = None
    # The workflow's default start limit in seconds (``@workflow(start_within=)``),
    # applied when the job gives no ``start_within`` of its own.
    start_within: float | None = None
    # The workflow's singleton policy when creating one takes a decision (skip,
    # cancel_in_progress: ``Registry.singleton``); None: no decision at creation.
    singleton: SingletonPolicy | None = None
    # The id reuse policy this delivery is created under: its own ``id_reuse`` if it
    # gives one (the worker checked it is not looser), else its workflow's.
    id_reuse: IdReuse = IdReuse.NEVER
    # The params key grouping the workflow's jobs into batches (``Registry.batch_key``):
    # the instance is created 'batching' (a member waiting in its key's pool); None: not
    # batched.
    batch_key: KeyPath | None = None
    # The workflow's debounce (``Registry.debounce``); None: none.
    debounce: DebouncePolicy | None = None


@dataclass(slots=True)
class CreateResult:
    """What one batch did. Every delivery is exactly one of: ``created`` (or
    ``tasks_created``), a new ``duplicates`` row, or ``already_recorded`` (its Kafka
    position already has a row: a redelivery seen before, nothing written)."""

    created: int = 0
    duplicates: int = 0  # new duplicate rows (redeliveries + resubmissions)
    mismatches: int = 0  # new duplicate rows whose params differ from the winner's
    redeliveries: int = 0  # new duplicate rows that are the same Kafka record again
    created_ids: list[str] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)
    mismatch_ids: list[str] = field(default_factory=list)
    tasks_created: int = 0
    # New duplicate rows whose workflow (or task) type differs from the winner's.
    workflow_mismatches: int = 0
    workflow_mismatch_ids: list[str] = field(default_factory=list)
    # Deliveries whose Kafka position was already recorded (as the creating record's
    # redelivery or as a duplicate): a redelivery again, which never counts twice.
    already_recorded: int = 0
    # Singleton decisions taken for the instances created: (workflow, decision) pairs,
    # one per created singleton instance (active or skipped) and one per older instance
    # it cancelled; the worker counts them (onceflow_streams_singleton_decisions_total).
    singleton_decisions: list[tuple[str, str]] = field(default_factory=list)
    # Id reuse decisions taken for resubmissions of finished-or-not job ids under a
    # policy other than never: (workflow, decision) pairs (IdReuseDecision), counted by
    # the worker (onceflow_streams_id_reuse_total); ``new_runs`` are the started runs'
    # job ids, also in ``created_ids`` (a new run is a creation).
    id_reuse_decisions: list[tuple[str, str]] = field(default_factory=list)
    new_runs: list[str] = field(default_factory=list)
    # Debounce decisions, (workflow, DebounceDecision) pairs: one per created instance of
    # a debounced workflow, and one per earlier pending instance it debounced
    # (onceflow_streams_debounce_decisions_total).
    debounce_decisions: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: CreateResult) -> None:
        self.created += other.created
        self.tasks_created += other.tasks_created
        self.duplicates += other.duplicates
        self.mismatches += other.mismatches
        self.redeliveries += other.redeliveries
        self.created_ids += other.created_ids
        self.duplicate_ids += other.duplicate_ids
        self.mismatch_ids += other.mismatch_ids
        self.workflow_mismatches += other.workflow_mismatches
        self.workflow_mismatch_ids += other.workflow_mismatch_ids
        self.already_recorded += other.already_recorded
        self.singleton_decisions += other.singleton_decisions
        self.id_reuse_decisions += other.id_reuse_decisions
        self.new_runs += other.new_runs
        self.debounce_decisions += other.debounce_decisions


# --- history --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One entry of an instance's history, as replay reads it."""

    position: int
    name: str
    status: StepStatus
    attempts: int
    result: Any
    kind: StepKind = StepKind.STEP
    wake_at: datetime | None = None
    error: str | None = None
    #: A child entry's child (the id it was started with: history decides, not the
    #: id a later scheme would derive).
    child_job_id: str | None = None


# --- definitions and their registry ---------------------------------------------------

#: A workflow function: ``async def f(ctx, params)`` (``ctx``: ``definitions.Context``).
WorkflowFn = Callable[[Any, dict[str, Any]], Awaitable[Any]]
TaskFn = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class WebhookSubscription:
    """A workflow's subscription to its instances' lifecycle events (``@workflow(...,
    webhooks=[...])``): the endpoint's name (``ONCEFLOW_WEBHOOK_ENDPOINTS``) and the kinds
    it gets (None: the endpoint's ``kinds``, by default the final ones)."""

    endpoint: str
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        problem = callback_problem(self.endpoint, None)
        if problem is not None:
            raise ValueError(f"webhooks: {problem[1]}")
        if self.kinds is not None:
            object.__setattr__(
                self, "kinds", check_kinds(self.kinds, f"webhooks[{self.endpoint!r}]")
            )


@dataclass(frozen=True, slots=True)
class WorkflowDef:
    """One workflow, as ``@workflow`` declared it."""

    fn: WorkflowFn
    name: str
    version: str  # the version new instances are created with
    inline_steps: bool = False  # its sync steps run on the event loop by default
    flow: FlowControl | None = None  # None: no flow control (the plain claim takes it)
    schedule: ScheduleDef | None = None
    webhooks: tuple[WebhookSubscription, ...] = ()  # its instances' lifecycle events
    # Seconds after submission before a new instance may start, unless the job says
    # (``run_at``/``start_after``); None: at once.
    start_after: float | None = None
    # Time limits in seconds (README, "Time limits"): errored as start_timeout if not
    # started this long after its start time; as timed_out at the first step boundary
    # this long after its first start. None: no limit.
    start_within: float | None = None
    execution_timeout: float | None = None
    singleton: SingletonPolicy | None = None  # ``@workflow(singleton=...)``
    id_reuse: IdReuse = IdReuse.NEVER  # ``@workflow(id_reuse=...)``
    batch: BatchPolicy | None = None  # ``@workflow(batch=...)``: its jobs run in batches

    debounce: DebouncePolicy | None = None  # ``@workflow(debounce=...)``


@dataclass(frozen=True, slots=True)
class TaskDef:
    """One single-step job type, as ``@task`` declared it (run by the streams worker)."""

    name: str
    fn: TaskFn
    max_retries: int = 3
    delay: float = 1.0


class Registry:
    """The workflows and tasks a process can run, each name once.

    Filled by the decorators (``definitions.REGISTRY``) and handed explicitly to the
    engine runner, the worker's batch handler and ingest, which read everything they
    need of a definition here: its version, flow control, lane, schedule, function.
    """

    def __init__(self) -> None:
        self._workflows: dict[str, WorkflowDef] = {}
        self._tasks: dict[str, TaskDef] = {}

    def add_workflow(self, definition: WorkflowDef) -> None:
        existing = self._workflows.get(definition.name)
        if (existing is not None and existing.fn is not definition.fn) or (
            definition.name in self._tasks
        ):
            raise ValueError(f"{definition.name!r} is registered twice")
        self._workflows[definition.name] = definition

    def add_task(self, definition: TaskDef) -> None:
        existing = self._tasks.get(definition.name)
        if definition.name in self._workflows or (
            existing is not None and existing.fn is not definition.fn
        ):
            raise ValueError(f"{definition.name!r} is registered twice")
        self._tasks[definition.name] = definition

    def workflow(self, name: str) -> WorkflowDef | None:
        return self._workflows.get(name)

    def task(self, name: str) -> TaskDef | None:
        return self._tasks.get(name)

    def kind_of(self, name: str) -> JobKind | None:
        """What a submitted type name is: a task, a workflow, or None (not registered)."""
        if name in self._tasks:
            return JobKind.TASK
        if name in self._workflows:
            return JobKind.WORKFLOW
        return None

    def workflow_names(self) -> list[str]:
        return sorted(self._workflows)

    def task_names(self) -> list[str]:
        return sorted(self._tasks)

    def version(self, name: str) -> str | None:
        """The version new instances of ``name`` are created with (None: not registered)."""
        definition = self._workflows.get(name)
        return None if definition is None else definition.version

    def versions(self) -> dict[str, str]:
        """The version of every registered workflow: what this process can run."""
        return {name: d.version for name, d in self._workflows.items()}

    def flows(self) -> dict[str, FlowControl]:
        """Every flow-controlled workflow's flow control (the engine's claim takes it)."""
        return {name: d.flow for name, d in self._workflows.items() if d.flow is not None}

    def start_after(self, name: str) -> float | None:
        """The default delayed start of workflow ``name`` (seconds), or None."""
        definition = self._workflows.get(name)
        return definition.start_after if definition is not None else None

    def start_within(self, name: str) -> float | None:
        """The default start limit of workflow ``name`` (seconds), or None."""
        definition = self._workflows.get(name)
        return definition.start_within if definition is not None else None

    def execution_timeouts(self) -> dict[str, float]:
        """Every workflow's execution timeout in seconds, of those that declare one (the
        claim that first starts an instance sets its deadline from it)."""
        return {
            name: d.execution_timeout
            for name, d in self._workflows.items()
            if d.execution_timeout is not None
        }

    def id_reuse(self, name: str) -> IdReuse:
        """Workflow ``name``'s id reuse policy (``never`` when not registered)."""
        definition = self._workflows.get(name)
        return definition.id_reuse if definition is not None else IdReuse.NEVER

    def singleton(self, name: str) -> SingletonPolicy | None:
        """The singleton policy creating an instance of ``name`` decides on (skip,
        cancel_in_progress), or None (none declared, or ``queue``: the claim's limit)."""
        definition = self._workflows.get(name)
        policy = definition.singleton if definition is not None else None
        return policy if policy is not None and policy.decides else None

    def batches(self) -> dict[str, BatchPolicy]:
        """Every batched workflow's policy (the engines' batch former takes it)."""
        return {name: d.batch for name, d in self._workflows.items() if d.batch is not None}

    def batch_key(self, name: str) -> KeyPath | None:
        """The params key whose value groups new instances of ``name`` into batches
        (``()``: one pool), or None: not batched (an instance runs on its own)."""
        definition = self._workflows.get(name)
        return None if definition is None or definition.batch is None else definition.batch.key

    def debounce(self, name: str) -> DebouncePolicy | None:
        """The debounce creating an instance of ``name`` decides on, or None."""
        definition = self._workflows.get(name)
        return definition.debounce if definition is not None else None

    def lane_path(self, name: str) -> KeyPath | None:
        """The key new instances of ``name`` store as their fairness lane: ``()`` for a
        workflow with flow control but no key (its lane is ''), None without flow
        control (no lane: the plain claim takes it)."""
        definition = self._workflows.get(name)
        if definition is None or definition.flow is None:
            return None
        return definition.flow.lane or ()

    def delivery(
        self,
        envelope: JobEnvelope,
        topic: str,
        partition: int,
        offset: int,
        *,
        kind: JobKind = JobKind.WORKFLOW,
        enqueued_at: datetime | None = None,
        origin: Origin | None = None,
    ) -> Delivery:
        """What creating ``envelope``'s instance takes: the job, where it came from, and
        this process's definition of its workflow (version, fairness lane, start delay
        and limit, singleton, id reuse, batching, debounce). The one place those are
        read for a new instance, whatever made the job: a Kafka record (the worker) or a
        schedule's tick (an engine, which drops what a tick never takes: batching,
        debounce, id reuse). A tick built without them bypassed its workflow's singleton
        and flow control (found in review)."""
        if kind != JobKind.WORKFLOW:
            return Delivery(envelope, topic, partition, offset, kind, enqueued_at, origin=origin)
        name = envelope.workflow
        return Delivery(
            envelope,
            topic,
            partition,
            offset,
            kind,
            enqueued_at,
            self.version(name),
            origin=origin,
            lane_path=self.lane_path(name),
            start_after=self.start_after(name),
            start_within=self.start_within(name),
            singleton=self.singleton(name),
            id_reuse=envelope.id_reuse or self.id_reuse(name),
            batch_key=self.batch_key(name),
            debounce=self.debounce(name),
        )

    def schedules(self) -> list[ScheduleDef]:
        """The schedules the registered workflows declare (engines upsert them), one per
        schedule name: where two workflows declare the same name, the one registered
        last (a schedule row has one workflow; upserting both would reset its place on
        every start)."""
        by_name = {d.schedule.name: d.schedule for d in self._workflows.values() if d.schedule}
        return [by_name[name] for name in sorted(by_name)]

    def webhooks(self, name: str) -> tuple[WebhookSubscription, ...]:
        """The webhook subscriptions of workflow ``name`` (none when not registered)."""
        definition = self._workflows.get(name)
        return () if definition is None else definition.webhooks

    def check_webhooks(self, configured: Iterable[str]) -> None:
        """ConfigurationError naming every subscription to an endpoint not in
        ``configured`` (the names of ``ONCEFLOW_WEBHOOK_ENDPOINTS``). The decorators run
        at import, before a process has read its settings: each process that is handed
        the registry checks it against its own (the engine and the dispatcher at start,
        when endpoints are configured)."""
        names = set(configured)
        unknown = sorted(
            f"{d.name!r} -> {w.endpoint!r}"
            for d in self._workflows.values()
            for w in d.webhooks
            if w.endpoint not in names
        )
        if unknown:
            raise ConfigurationError(
                f"webhooks to endpoints that are not configured: {', '.join(unknown)}"
                f" (configured: {', '.join(sorted(names)) or 'none'}; ONCEFLOW_WEBHOOK_ENDPOINTS)"
            )
