"""The engine's lease-guarded writes, one frozen dataclass per kind.

A write crosses two seams: the engine queues it to its group-commit writer
(:mod:`workflow_engine.engine.batcher`), and the store applies a batch of them
(:func:`workflow_engine.store.execution.write_batch`), grouped by class, one multi-row
statement per class. ``Write[T]`` names the answer a write gets once committed, so
``await batcher.write(StartStep(...))`` is an ``int`` to the type checker too. A write
that cannot apply answers with the exception its instance should raise instead
(``LeaseLost``, ``ControlRequested``, ``NonDeterminismError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from onceflow.vocabulary import AttemptOutcome, InstanceStatus

T = TypeVar("T", covariant=True)


class Write(Generic[T]):
    """Base of the batched writes; ``T`` is the answer of a committed write."""

    __slots__ = ()

    #: True for a write that touches every row the engine leases (the heartbeat): the
    #: writer runs a batch carrying it alone, so an engine's own transactions never
    #: lock its rows in conflicting orders.
    runs_alone: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class StartStep(Write[int]):
    """Record a new attempt of step ``name`` at ``position``; answers the attempt number."""

    job_id: str
    position: int
    name: str


@dataclass(frozen=True, slots=True)
class FinishStep(Write[None]):
    """Close an attempt: checkpoint its result, or record its failure or retry."""

    job_id: str
    position: int
    attempt: int
    outcome: AttemptOutcome
    result: bytes | None = None  # JSON
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FinishInstance(Write[None]):
    """Bring an instance to a final status and release its lease."""

    job_id: str
    status: InstanceStatus
    result: bytes | None = None  # JSON
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat(Write[frozenset[str]]):
    """Extend the leases of ``job_ids``; answers the ids this engine still holds."""

    runs_alone: ClassVar[bool] = True

    job_ids: tuple[str, ...]
    lease_seconds: float


#: What a write answers when applied: its value, or the exception for its instance.
Answer = object
