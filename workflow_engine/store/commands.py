"""The engine's lease-guarded writes, one frozen dataclass per kind.

A write crosses two seams: the engine queues it to its group-commit writer
(:mod:`workflow_engine.engine.batcher`), and the store applies a batch of them
(:func:`workflow_engine.store.writes.execution.write_batch`), grouped by class, one multi-row
statement per class. ``Write[T]`` names the answer a write gets once committed, so
``await batcher.write(StartStep(...))`` is a :class:`Started` to the type checker too. A write
that cannot apply answers with the exception its instance should raise instead
(``LeaseLost``, ``ControlRequested``, ``NonDeterminismError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Generic, NamedTuple, TypeVar

from onceflow.vocabulary import AttemptOutcome, InstanceStatus, TimeoutKind

T = TypeVar("T", covariant=True)


class Lease(NamedTuple):
    """The fencing token of one claim of one instance: the engine that holds it and the
    instance's ``claim_count`` when it was claimed.

    Every guarded write names both (``fragments.held``), so a run from an older claim
    can never write, even in the engine that holds the newer one: after a rescue
    re-queued an instance whose run was cut off from the database, the same engine may
    claim it again, and the owner string alone could not tell the two runs apart."""

    owner: str
    claim: int


class Write(Generic[T]):
    """Base of the batched writes; ``T`` is the answer of a committed write."""

    __slots__ = ()

    #: True for a write that touches every row the engine leases (the heartbeat): the
    #: writer runs a batch carrying it alone, so an engine's own transactions never
    #: lock its rows in conflicting orders.
    runs_alone: ClassVar[bool] = False


class Started(NamedTuple):
    """What a committed ``StartStep`` answers."""

    attempt: int  # 1-based
    #: The attempt row's ``started_at``: the partition key of ``onceflow_step_attempts``,
    #: carried to the attempt's close so that update reads one partition, not all.
    at: datetime
    #: The attempt within the step's retry budget (what the retry policy counts): the
    #: attempt itself, unless an operator retried the step (``retry_base``, 0020).
    tries: int


@dataclass(frozen=True, slots=True)
class StartStep(Write[Started]):
    """Record a new attempt of step ``name`` at ``position``; answers its number and
    start time."""

    job_id: str
    claim: int  # the run's ``Lease.claim``
    position: int
    name: str


@dataclass(frozen=True, slots=True)
class FinishStep(Write[None]):
    """Close an attempt: checkpoint its result, or record its failure or retry."""

    job_id: str
    claim: int
    position: int
    attempt: int
    started_at: datetime  # ``Started.at`` of the attempt
    outcome: AttemptOutcome
    result: bytes | None = None  # JSON
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FinishInstance(Write[None]):
    """Bring an instance to a final status and release its lease."""

    job_id: str
    claim: int
    status: InstanceStatus
    result: bytes | None = None  # JSON
    error: str | None = None
    # Errored by a step's failure: that step's history position (retry runs it again).
    failed_position: int | None = None
    # Errored by a time limit (``onceflow_instances.timeout_kind``): ``timed_out``.
    timeout: TimeoutKind | None = None


class Appended(NamedTuple):
    """What a committed ``AppendValue`` answers."""

    #: The value's place in its instance's streams; None if a replay emitted it again
    #: (its key was already there: nothing was written).
    seq: int | None


@dataclass(frozen=True, slots=True)
class AppendValue(Write[Appended]):
    """Append one JSON value to stream ``stream`` of an instance, once per ``key`` (a
    replay's emit collapses), within the instance's bounds (``max_values`` values and
    ``max_bytes`` bytes in all; past them it answers ``StreamLimitReached``)."""

    job_id: str
    claim: int
    key: str
    stream: str
    value: bytes  # JSON
    max_values: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Chain(Write[T]):
    """A step's checkpoint and the write that follows it in its instance (the next
    step's start, the instance's finish), committed in one transaction, in order.

    This is how a workflow pays one commit per step instead of two: the checkpoint of
    step N waits until the workflow asks for its next durable operation and goes with
    it. Nothing that follows runs before both commit. Answers what ``then`` answers;
    if ``first`` cannot apply (the lease was lost), its exception, and ``then`` is not
    applied either.
    """

    first: FinishStep
    then: Write[T]


@dataclass(frozen=True, slots=True)
class Heartbeat(Write[frozenset[tuple[str, int]]]):
    """Extend the leases of ``held`` (``(job_id, claim)`` pairs); answers the pairs this
    engine still holds."""

    runs_alone: ClassVar[bool] = True

    held: tuple[tuple[str, int], ...]
    lease_seconds: float


#: What a write answers when applied: its value, or the exception for its instance.
Answer = object
